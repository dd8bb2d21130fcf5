//! The built-in model of a person's answers: how likely a person is to
//! approve a call, from the grants and denials people already gave, and
//! the action of least expected cost. Pure: no I/O, no clock (the time is
//! an argument), so every rule here is a unit test.
//!
//! - **Per key, a Beta–Binomial.** Each key (see [`Level`]) keeps the
//!   grants and denials recorded for it, each weighing `2^(-age /
//!   half-life)` (a person's latest answers count more; an answer one
//!   half-life old counts half). With a uniform prior Beta(1, 1) the
//!   probability of approval is Beta(1 + grants, 1 + denials).
//! - **Conservative bounds, not a point estimate.** Allowing needs the
//!   lower one-sided 95% credible bound above the allow threshold; denying
//!   needs the upper bound below the deny threshold. Few answers give wide
//!   bounds, so they ask.
//! - **Back-off.** The most specific level with at least [`MIN_EVIDENCE`]
//!   answers (counted whole: their weights decide p, not whether a level
//!   may speak) decides: exact (caller, credential, tool, argument shape) →
//!   (caller, tool) → (tool). **Only the exact level may allow**: the
//!   others may deny or ask. Answers about other shapes or credentials
//!   (caller, tool), or other callers (tool), never vouch for this call:
//!   else an agent whose call a person denied could add one dummy argument
//!   (a new shape, no exact answers) or use another credential and be
//!   allowed on the strength of other calls (found by the attack review).
//! - **A fresh denial puts a person back in the loop.** When the latest
//!   answer at the exact level is a denial, nothing is allowed there until
//!   a person grants again: a person who denied one value of a call the
//!   shape cannot tell from others sees the next one.

use std::collections::HashMap;

pub use crate::config::{CostError, Costs, Thresholds};

/// The one-sided credible level of the bounds.
pub const CREDIBLE: f64 = 0.95;
/// The answers a level needs before it decides rather than backing off to
/// a less specific one (counted whole, however old: three answers given a
/// minute ago are three, not 2.9999).
pub const MIN_EVIDENCE: u32 = 3;

/// The three actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Allow,
    Deny,
    Ask,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Deny => "deny",
            Action::Ask => "ask",
        }
    }
}

/// The levels evidence is kept at, most specific first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Level {
    /// Caller, credential, tool and argument shape.
    #[serde(rename = "exact")]
    Exact,
    /// Caller and tool, any credential and shape.
    #[serde(rename = "caller-tool")]
    CallerTool,
    /// The tool, for every caller: may deny or ask, never allow.
    #[serde(rename = "tool")]
    Tool,
}

impl Level {
    pub const ALL: [Level; 3] = [Level::Exact, Level::CallerTool, Level::Tool];

    pub fn as_str(self) -> &'static str {
        match self {
            Level::Exact => "exact",
            Level::CallerTool => "caller-tool",
            Level::Tool => "tool",
        }
    }
}

/// One person's answer, as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// Unix milliseconds.
    pub at: i64,
    pub caller: String,
    /// `None` on answers recorded before credentials and shapes were kept:
    /// they count at the (caller, tool) and (tool) levels only.
    pub credential: Option<String>,
    pub tool: String,
    pub shape: Option<String>,
    pub granted: bool,
}

/// What a call is, to the model.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub caller: &'a str,
    pub credential: &'a str,
    pub tool: &'a str,
    /// [`shape`] of its arguments.
    pub shape: &'a str,
}

/// Decayed grants and denials of one key, as of `at`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Tally {
    grants: f64,
    denials: f64,
    /// Answers recorded, whole.
    answers: u32,
    /// When the latest grant and the latest denial were given (unix ms;
    /// `i64::MIN`: none).
    last_grant: i64,
    last_denial: i64,
    /// Unix milliseconds the weights are as of.
    at: i64,
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            grants: 0.0,
            denials: 0.0,
            answers: 0,
            last_grant: i64::MIN,
            last_denial: i64::MIN,
            at: 0,
        }
    }
}

impl Tally {
    fn add(&mut self, granted: bool, at: i64, half_life_ms: f64) {
        let w = if at >= self.at {
            let k = decay(at - self.at, half_life_ms);
            self.grants *= k;
            self.denials *= k;
            self.at = at;
            1.0
        } else {
            decay(self.at - at, half_life_ms)
        };
        if granted {
            self.grants += w;
            self.last_grant = self.last_grant.max(at);
        } else {
            self.denials += w;
            self.last_denial = self.last_denial.max(at);
        }
        self.answers = self.answers.saturating_add(1);
    }

    /// (grants, denials) weighed as of `now` (never more than recorded:
    /// a clock behind the newest answer does not inflate them), and the
    /// answers whole.
    fn at(&self, now: i64, half_life_ms: f64) -> (f64, f64, u32, bool) {
        let k = decay(now - self.at, half_life_ms);
        let latest_denied = self.last_denial > self.last_grant;
        (
            self.grants * k,
            self.denials * k,
            self.answers,
            latest_denied,
        )
    }
}

/// `2^(-age / half-life)`, 1 for an age ≤ 0.
fn decay(age_ms: i64, half_life_ms: f64) -> f64 {
    if age_ms <= 0 {
        1.0
    } else {
        (-(age_ms as f64) / half_life_ms).exp2()
    }
}

/// The evidence of one level, as shown and decided on.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Evidence {
    pub level: Level,
    /// Decayed to the time of the prediction.
    pub grants: f64,
    pub denials: f64,
    /// The answers recorded at this level, whole (at least
    /// [`MIN_EVIDENCE`] for it to decide).
    pub answers: u32,
    /// The latest answer at this level was a denial.
    pub latest_denied: bool,
    /// The one-sided [`CREDIBLE`] bounds of the probability of approval,
    /// when computed: a prediction computes only the one its action rests
    /// on (each is an inverse incomplete beta, the costliest step);
    /// [`Model::explain`] computes all.
    pub lower: Option<f64>,
    pub upper: Option<f64>,
}

impl Evidence {
    fn of(
        level: Level,
        (grants, denials, answers, latest_denied): (f64, f64, u32, bool),
    ) -> Evidence {
        Evidence {
            level,
            grants,
            denials,
            answers,
            latest_denied,
            lower: None,
            upper: None,
        }
    }

    /// Both bounds, computing those not computed yet.
    pub fn bounds(&self) -> (f64, f64) {
        (
            self.lower.unwrap_or_else(|| self.lower()),
            self.upper.unwrap_or_else(|| self.upper()),
        )
    }

    /// The posterior's parameters: Beta(1 + grants, 1 + denials).
    fn beta(&self) -> (f64, f64) {
        (1.0 + self.grants, 1.0 + self.denials)
    }

    fn lower(&self) -> f64 {
        let (a, b) = self.beta();
        statrs::function::beta::inv_beta_reg(a, b, 1.0 - CREDIBLE)
    }

    fn upper(&self) -> f64 {
        let (a, b) = self.beta();
        statrs::function::beta::inv_beta_reg(a, b, CREDIBLE)
    }

    /// Whether the lower bound is above `t`: P(p ≤ t) < 1 − CREDIBLE, one
    /// incomplete beta rather than its inverse.
    fn surely_above(&self, t: f64) -> bool {
        let (a, b) = self.beta();
        statrs::function::beta::beta_reg(a, b, t) < 1.0 - CREDIBLE
    }

    /// Whether the upper bound is below `t`: P(p ≤ t) > CREDIBLE.
    fn surely_below(&self, t: f64) -> bool {
        let (a, b) = self.beta();
        statrs::function::beta::beta_reg(a, b, t) > CREDIBLE
    }
}

/// A rule that kept a level's bound from allowing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Blocked {
    /// Only the exact level allows; this one backs off from it.
    NotExact(Level),
    /// The latest answer at the exact level was a denial.
    LatestDenied,
}

/// A prediction and its grounds.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Prediction {
    pub action: Action,
    /// The bound the action rests on: the lower bound for an allow, the
    /// upper for a deny, the posterior mean for an ask (`None`: no level
    /// had enough answers).
    pub p: Option<f64>,
    /// The level that decided (`None`: none had enough answers).
    pub level: Option<Level>,
    /// Every level's evidence, most specific first.
    pub levels: [Evidence; 3],
    pub thresholds: Thresholds,
    /// The deciding level's lower bound was above the allow threshold, but
    /// a rule of the back-off kept it from allowing.
    pub blocked: Option<Blocked>,
}

impl Prediction {
    /// Why, in one line (the decision and what it rests on), without
    /// naming the call: `predicted approval 0.762 > 0.75 from 10 grants, 0
    /// denials at exact`.
    pub fn grounds(&self) -> String {
        let t = &self.thresholds;
        let (allow, deny) = (prob(t.allow), prob(t.deny));
        let Some(e) = self.evidence() else {
            return format!("no level has {MIN_EVIDENCE} answers yet: a person decides");
        };
        let from = format!(
            "from {}, {} at {}",
            plural(e.grants, "grant"),
            plural(e.denials, "denial"),
            e.level.as_str()
        );
        let (lower, upper) = e.bounds();
        match (self.action, self.blocked) {
            (Action::Allow, _) => format!("predicted approval {lower:.3} > {allow} {from}"),
            (Action::Deny, _) => {
                format!("predicted denial: approval at most {upper:.3} < {deny} {from}")
            }
            (Action::Ask, Some(Blocked::NotExact(Level::Tool))) => format!(
                "the tool level pools every caller's answers and never allows (lower bound {lower:.3} > {allow}): a person decides {from}"
            ),
            (Action::Ask, Some(Blocked::NotExact(_))) => format!(
                "only answers about this caller, credential, tool and shape allow; {} answers may deny or ask (lower bound {lower:.3} > {allow}): a person decides {from}",
                e.level.as_str()
            ),
            (Action::Ask, Some(Blocked::LatestDenied)) => format!(
                "the latest answer to calls like this was a denial (lower bound {lower:.3} > {allow}): a person decides {from}"
            ),
            (Action::Ask, None) => format!(
                "lower bound {lower:.3} not above {allow}, upper bound {upper:.3} not below {deny}: a person decides {from}"
            ),
        }
    }

    /// The deciding level's evidence.
    pub fn evidence(&self) -> Option<&Evidence> {
        self.levels.iter().find(|e| Some(e.level) == self.level)
    }
}

/// Every answer recorded, folded per key at each level.
#[derive(Debug, Clone)]
pub struct Model {
    half_life_ms: f64,
    exact: HashMap<String, Tally>,
    caller_tool: HashMap<String, Tally>,
    tool: HashMap<String, Tally>,
}

/// One unambiguous key of several parts (each length-prefixed: a tool
/// name is the agent's to choose and may hold any character).
fn key(parts: &[&str]) -> String {
    let mut k = String::with_capacity(parts.iter().map(|p| p.len() + 4).sum());
    for p in parts {
        k.push_str(itoa::Buffer::new().format(p.len()));
        k.push(':');
        k.push_str(p);
    }
    k
}

impl Model {
    /// An empty model whose answers weigh half after `half_life`.
    pub fn new(half_life: std::time::Duration) -> Model {
        Model {
            half_life_ms: (half_life.as_millis() as f64).max(1.0),
            exact: HashMap::new(),
            caller_tool: HashMap::new(),
            tool: HashMap::new(),
        }
    }

    /// Record a person's answer.
    pub fn add(&mut self, a: &Answer) {
        let hl = self.half_life_ms;
        if let (Some(credential), Some(shape)) = (&a.credential, &a.shape) {
            self.exact
                .entry(key(&[&a.caller, credential, &a.tool, shape]))
                .or_default()
                .add(a.granted, a.at, hl);
        }
        self.caller_tool
            .entry(key(&[&a.caller, &a.tool]))
            .or_default()
            .add(a.granted, a.at, hl);
        self.tool
            .entry(key(&[&a.tool]))
            .or_default()
            .add(a.granted, a.at, hl);
    }

    /// Each level's evidence for `s` as of `now` (unix ms).
    pub fn evidence(&self, s: &Subject<'_>, now: i64) -> [Evidence; 3] {
        let hl = self.half_life_ms;
        let get = |map: &HashMap<String, Tally>, k: String| {
            map.get(&k).map_or((0.0, 0.0, 0, false), |t| t.at(now, hl))
        };
        [
            Evidence::of(
                Level::Exact,
                get(&self.exact, key(&[s.caller, s.credential, s.tool, s.shape])),
            ),
            Evidence::of(
                Level::CallerTool,
                get(&self.caller_tool, key(&[s.caller, s.tool])),
            ),
            Evidence::of(Level::Tool, get(&self.tool, key(&[s.tool]))),
        ]
    }

    /// The action of least expected cost for `s` at `now`, by the rules of
    /// this module.
    pub fn predict(&self, s: &Subject<'_>, t: &Thresholds, now: i64) -> Prediction {
        decide(self.evidence(s, now), t)
    }

    /// [`Model::predict`] with every level's bounds, to show.
    pub fn explain(&self, s: &Subject<'_>, t: &Thresholds, now: i64) -> Prediction {
        let mut p = self.predict(s, t, now);
        for e in &mut p.levels {
            e.lower = Some(e.lower());
            e.upper = Some(e.upper());
        }
        p
    }
}

/// The decision on each level's evidence (most specific first).
pub fn decide(mut levels: [Evidence; 3], t: &Thresholds) -> Prediction {
    let deciding = levels.iter().position(|e| e.answers >= MIN_EVIDENCE);
    let mut blocked = None;
    let (action, p) = match deciding {
        None => (Action::Ask, None),
        Some(i) => {
            let e = &mut levels[i];
            let rule = match e.level {
                Level::Exact if e.latest_denied => Some(Blocked::LatestDenied),
                Level::Exact => None,
                other => Some(Blocked::NotExact(other)),
            };
            if e.surely_above(t.allow) {
                if rule.is_none() {
                    let lower = e.lower();
                    e.lower = Some(lower);
                    return Prediction {
                        action: Action::Allow,
                        p: Some(lower),
                        level: Some(e.level),
                        levels,
                        thresholds: *t,
                        blocked: None,
                    };
                }
                blocked = rule;
            }
            if e.surely_below(t.deny) {
                let upper = e.upper();
                e.upper = Some(upper);
                blocked = None;
                (Action::Deny, Some(upper))
            } else {
                let mean = (1.0 + e.grants) / (2.0 + e.grants + e.denials);
                (Action::Ask, Some(mean))
            }
        }
    };
    Prediction {
        action,
        p,
        level: deciding.map(|i| levels[i].level),
        levels,
        thresholds: *t,
        blocked,
    }
}

/// The longest shape kept as written; a longer one is kept as a digest.
const MAX_SHAPE_BYTES: usize = 512;
/// How deep objects are described; deeper ones are `object`.
const MAX_SHAPE_DEPTH: usize = 4;

/// A call's argument shape: the argument names and JSON types, not the
/// values, members sorted, objects described to [`MAX_SHAPE_DEPTH`]:
/// `{suite:string,verbose:boolean}`, `{opts:{force:boolean}}`. A name
/// other than letters, digits, `_`, `-` and `.` is written as a JSON
/// string, so no two shapes share one text. No arguments are `{}`;
/// arguments that are not JSON are `?`. A shape longer than 512 bytes is
/// `#` and 16 hex digits of its SHA-256.
pub fn shape(arguments: Option<&str>) -> String {
    let Some(text) = arguments else {
        return "{}".into();
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(text) else {
        return "?".into();
    };
    let mut out = String::new();
    describe(&v, 0, &mut out);
    if out.len() > MAX_SHAPE_BYTES {
        let digest = crate::crypto::tokens::sha256_hex(out.as_bytes());
        return format!("#{}", &digest[..16]);
    }
    out
}

fn describe(v: &serde_json::Value, depth: usize, out: &mut String) {
    use serde_json::Value;
    match v {
        Value::Object(m) if depth < MAX_SHAPE_DEPTH => {
            let mut names: Vec<_> = m.iter().collect();
            names.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (k, v)) in names.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let plain = !k.is_empty()
                    && k.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
                if plain {
                    out.push_str(k);
                } else {
                    out.push_str(&Value::from(k.as_str()).to_string());
                }
                out.push(':');
                describe(v, depth + 1, out);
            }
            out.push('}');
        }
        Value::Object(_) => out.push_str("object"),
        Value::Array(_) => out.push_str("array"),
        Value::String(_) => out.push_str("string"),
        Value::Number(_) => out.push_str("number"),
        Value::Bool(_) => out.push_str("boolean"),
        Value::Null => out.push_str("null"),
    }
}

/// A probability or threshold, as people read it: at most four decimals,
/// no trailing zeros (`0.99`, `0.9524`).
pub fn prob(p: f64) -> String {
    let s = format!("{p:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() {
        "0".into()
    } else {
        s.to_string()
    }
}

/// `n` things, as people write it: `1 grant`, `2 grants`, `2.5 grants`.
pub fn plural(n: f64, thing: &str) -> String {
    let c = count(n);
    if c == "1" {
        format!("1 {thing}")
    } else {
        format!("{c} {thing}s")
    }
}

/// A count of decayed answers, as people read it: whole when it is.
pub fn count(n: f64) -> String {
    if (n - n.round()).abs() < 0.05 {
        format!("{}", n.round() as i64)
    } else {
        format!("{n:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const DAY: i64 = 86_400_000;

    fn t(allow: f64, deny: f64) -> Thresholds {
        Thresholds { allow, deny }
    }

    fn answer(caller: &str, tool: &str, shape: &str, granted: bool, at: i64) -> Answer {
        Answer {
            at,
            caller: caller.into(),
            credential: Some("gh".into()),
            tool: tool.into(),
            shape: Some(shape.into()),
            granted,
        }
    }

    fn subject<'a>(caller: &'a str, tool: &'a str, shape: &'a str) -> Subject<'a> {
        Subject {
            caller,
            credential: "gh",
            tool,
            shape,
        }
    }

    fn model(answers: &[Answer]) -> Model {
        let mut m = Model::new(Duration::from_millis(30 * DAY as u64));
        answers.iter().for_each(|a| m.add(a));
        m
    }

    fn grants(n: usize, caller: &str, tool: &str, shape: &str) -> Vec<Answer> {
        (0..n)
            .map(|i| answer(caller, tool, shape, true, i as i64))
            .collect()
    }

    #[test]
    fn the_lower_bound_allows_only_on_enough_grants() {
        let th = t(0.75, 0.2);
        let s = subject("agent", "run_tests", "{suite:string}");
        // Beta(1 + n, 1): the 5% quantile is 0.05^(1/(n+1)).
        let nine = model(&grants(9, "agent", "run_tests", "{suite:string}"));
        let p = nine.predict(&s, &th, 10);
        assert_eq!(p.action, Action::Ask, "{p:?}");
        let e = nine.explain(&s, &th, 10);
        assert!((e.levels[0].lower.unwrap() - 0.05f64.powf(1.0 / 10.0)).abs() < 1e-9);
        let ten = model(&grants(10, "agent", "run_tests", "{suite:string}"));
        let p = ten.predict(&s, &th, 10);
        assert_eq!((p.action, p.level), (Action::Allow, Some(Level::Exact)));
        assert!(
            (p.p.unwrap() - 0.05f64.powf(1.0 / 11.0)).abs() < 1e-9,
            "{p:?}"
        );
        // The point estimate (11/12 = 0.92) would have allowed at nine;
        // the defaults need about three hundred clean grants.
        let many = model(&grants(300, "agent", "run_tests", "{suite:string}"));
        let def = Costs::default().thresholds().unwrap();
        assert_eq!(many.predict(&s, &def, 300).action, Action::Allow);
        assert_eq!(
            model(&grants(250, "agent", "run_tests", "{suite:string}"))
                .predict(&s, &def, 300)
                .action,
            Action::Ask
        );
    }

    #[test]
    fn denials_weigh_as_grants_do_and_the_upper_bound_denies() {
        let th = t(0.75, 0.2);
        let s = subject("agent", "run_tests", "{suite:string}");
        let mut a = grants(10, "agent", "run_tests", "{suite:string}");
        a.push(answer("agent", "run_tests", "{suite:string}", false, 11));
        assert_eq!(model(&a).predict(&s, &th, 12).action, Action::Ask);
        // Upper 95% bound of Beta(1, 1 + n) is 1 - 0.05^(1/(n+1)).
        let denials = |n: usize| -> Vec<Answer> {
            (0..n)
                .map(|i| answer("agent", "run_x", "{}", false, i as i64))
                .collect()
        };
        let s = subject("agent", "run_x", "{}");
        assert_eq!(model(&denials(12)).predict(&s, &th, 20).action, Action::Ask);
        let p = model(&denials(13)).predict(&s, &th, 20);
        assert_eq!(p.action, Action::Deny, "{p:?}");
        assert!((p.p.unwrap() - (1.0 - 0.05f64.powf(1.0 / 14.0))).abs() < 1e-9);
    }

    #[test]
    fn no_evidence_asks() {
        let p = model(&[]).predict(&subject("a", "t", "{}"), &t(0.5, 0.4), 0);
        assert_eq!((p.action, p.level, p.p), (Action::Ask, None, None));
        // Two answers are not enough to decide at any level.
        let p =
            model(&grants(2, "a", "t", "{}")).predict(&subject("a", "t", "{}"), &t(0.1, 0.05), 5);
        assert_eq!((p.action, p.level), (Action::Ask, None));
    }

    #[test]
    fn backing_off_goes_from_exact_to_caller_and_tool_to_tool() {
        let th = t(0.75, 0.2);
        let learnt = model(&grants(10, "agent", "run_tests", "{suite:string}"));
        // Another shape of the same caller's tool: (caller, tool) decides,
        // and it does not allow (an added argument is another call).
        let p = learnt.predict(&subject("agent", "run_tests", "{suite:number}"), &th, 10);
        assert_eq!((p.action, p.level), (Action::Ask, Some(Level::CallerTool)));
        assert_eq!(p.blocked, Some(Blocked::NotExact(Level::CallerTool)));
        // Another credential (a test one granted, a production one asked)
        // counts at (caller, tool) alone too: no allow either.
        let other = Subject {
            credential: "gl",
            ..subject("agent", "run_tests", "{suite:string}")
        };
        let p = learnt.predict(&other, &th, 10);
        assert_eq!((p.action, p.level), (Action::Ask, Some(Level::CallerTool)));
        // But (caller, tool) denies: denials of other shapes say no.
        let denied: Vec<Answer> = (0..14)
            .map(|i| answer("agent", "run_x", "{a:string}", false, i))
            .collect();
        let p = model(&denied).predict(&subject("agent", "run_x", "{b:string}"), &th, 20);
        assert_eq!((p.action, p.level), (Action::Deny, Some(Level::CallerTool)));
        // Another caller: only the tool level has answers, and it never allows.
        let p = learnt.predict(&subject("agent-2", "run_tests", "{suite:string}"), &th, 10);
        assert_eq!((p.action, p.level), (Action::Ask, Some(Level::Tool)));
        // ... but it denies.
        let denied: Vec<Answer> = (0..14)
            .map(|i| answer("agent", "run_x", "{}", false, i))
            .collect();
        let p = model(&denied).predict(&subject("agent-2", "run_x", "{}"), &th, 20);
        assert_eq!((p.action, p.level), (Action::Deny, Some(Level::Tool)));
        // Another tool: no evidence.
        let p = learnt.predict(&subject("agent", "run_lint", "{suite:string}"), &th, 10);
        assert_eq!((p.action, p.level), (Action::Ask, None));
    }

    #[test]
    fn the_grounds_name_the_bounds_compared_and_the_rule_that_blocked() {
        let th = t(0.75, 0.2);
        let four = model(&grants(4, "agent", "run_tests", "{}"));
        let g = four
            .predict(&subject("agent", "run_tests", "{}"), &th, 5)
            .grounds();
        assert!(
            g.starts_with("lower bound 0.549 not above 0.75, upper bound 0.990 not below 0.2: a person decides from 4 grants, 0 denials at exact"),
            "{g}"
        );
        let g = model(&grants(10, "agent", "run_tests", "{}"))
            .predict(&subject("agent-2", "run_tests", "{}"), &th, 10)
            .grounds();
        assert!(
            g.starts_with("the tool level pools every caller's answers and never allows"),
            "{g}"
        );
        let a = grants(30, "agent", "run_tests", "{a:string}");
        let p = model(&a).predict(&subject("agent", "run_tests", "{b:string}"), &th, 41);
        assert_eq!(p.blocked, Some(Blocked::NotExact(Level::CallerTool)));
        assert!(p.grounds().starts_with("only answers about this caller, credential, tool and shape allow; caller-tool answers may deny or ask"), "{}", p.grounds());
        let one = model(&[answer("a", "t", "{}", true, 0)]);
        let g = one.predict(&subject("a", "t", "{}"), &th, 0).grounds();
        assert_eq!(g, "no level has 3 answers yet: a person decides");
        assert_eq!(plural(1.0, "grant"), "1 grant");
        assert_eq!(plural(0.0, "denial"), "0 denials");
    }

    #[test]
    fn a_level_speaks_on_its_answers_counted_whole() {
        // Three answers a little old weigh a hair under three: the level
        // still decides (found by a new user: it took four).
        let th = t(0.4, 0.2);
        let mut m = Model::new(Duration::from_millis(DAY as u64));
        for i in 0..3 {
            m.add(&answer("a", "t", "{}", true, i));
        }
        let p = m.predict(&subject("a", "t", "{}"), &th, 60_000);
        assert!(p.levels[0].grants < 3.0, "{p:?}");
        assert_eq!((p.level, p.levels[0].answers), (Some(Level::Exact), 3));
        assert_eq!(p.action, Action::Allow, "{p:?}");
    }

    #[test]
    fn an_added_argument_does_not_escape_a_denial() {
        // Found by the attack review: with denials of {suite, shell}, the
        // agent added a dummy argument (a shape with no answers) and was
        // allowed on the strength of the {suite} grants.
        let th = t(0.75, 0.2);
        let mut a = grants(30, "agent", "run_tests", "{suite:string}");
        for at in [40, 41] {
            a.push(answer(
                "agent",
                "run_tests",
                "{shell:string,suite:string}",
                false,
                at,
            ));
        }
        let m = model(&a);
        for shape in [
            "{shell:string,suite:string}",
            "{shell:string,suite:string,z:null}",
        ] {
            let p = m.predict(&subject("agent", "run_tests", shape), &th, 42);
            assert_eq!(p.action, Action::Ask, "{shape}: {p:?}");
        }
        // The shape people granted is still allowed.
        let p = m.predict(&subject("agent", "run_tests", "{suite:string}"), &th, 42);
        assert_eq!(p.action, Action::Allow);
    }

    #[test]
    fn a_fresh_denial_asks_until_a_person_grants_again() {
        // Found by the attack review: one denied value of a well-granted
        // shape, tweaked by a space, was allowed.
        let th = t(0.75, 0.2);
        let mut a = grants(40, "agent", "run_tests", "{suite:string}");
        a.push(answer("agent", "run_tests", "{suite:string}", false, 50));
        let s = subject("agent", "run_tests", "{suite:string}");
        let p = model(&a).predict(&s, &th, 51);
        assert!(p.levels[0].surely_above(th.allow), "{p:?}");
        assert_eq!(
            (p.action, p.blocked),
            (Action::Ask, Some(Blocked::LatestDenied))
        );
        assert!(p
            .grounds()
            .starts_with("the latest answer to calls like this was a denial"));
        a.push(answer("agent", "run_tests", "{suite:string}", true, 52));
        assert_eq!(model(&a).predict(&s, &th, 53).action, Action::Allow);
    }

    #[test]
    fn old_answers_fade_with_the_half_life() {
        let th = t(0.75, 0.2);
        let s = subject("agent", "run_tests", "{}");
        let mut m = Model::new(Duration::from_millis(DAY as u64));
        for i in 0..10 {
            m.add(&answer("agent", "run_tests", "{}", true, i));
        }
        assert_eq!(m.predict(&s, &th, 10).action, Action::Allow);
        // A day later each grant weighs half: five, which asks.
        let p = m.predict(&s, &th, 10 + DAY);
        assert_eq!(p.action, Action::Ask);
        assert!((p.levels[0].grants - 5.0).abs() < 0.01, "{p:?}");
        // A recent denial outweighs old grants: ten grants a week old weigh
        // less than one, and one denial today (with the two recent grants)
        // does not allow.
        let mut m = Model::new(Duration::from_millis(DAY as u64));
        for i in 0..10 {
            m.add(&answer("agent", "run_tests", "{}", true, i));
        }
        for at in [7 * DAY, 7 * DAY + 1] {
            m.add(&answer("agent", "run_tests", "{}", true, at));
        }
        m.add(&answer("agent", "run_tests", "{}", false, 7 * DAY + 2));
        let p = m.predict(&s, &th, 7 * DAY + 3);
        assert!(
            p.levels[0].grants < 2.2 && p.levels[0].denials > 0.99,
            "{p:?}"
        );
        assert_eq!(p.action, Action::Ask);
        // Answers arriving out of order weigh by their own age.
        let mut m = Model::new(Duration::from_millis(DAY as u64));
        m.add(&answer("a", "t", "{}", true, DAY));
        m.add(&answer("a", "t", "{}", true, 0));
        let e = m.evidence(&subject("a", "t", "{}"), DAY);
        assert!((e[0].grants - 1.5).abs() < 1e-9, "{e:?}");
        // A clock behind the newest answer does not inflate it.
        assert!((m.evidence(&subject("a", "t", "{}"), 0)[0].grants - 1.5).abs() < 1e-9);
    }

    #[test]
    fn answers_without_a_shape_count_from_caller_and_tool_up() {
        let mut m = Model::new(Duration::from_secs(86_400));
        for i in 0..5 {
            m.add(&Answer {
                credential: None,
                shape: None,
                ..answer("agent", "run_tests", "", true, i)
            });
        }
        let e = m.evidence(&subject("agent", "run_tests", "{}"), 4);
        assert_eq!(e[0].grants, 0.0);
        assert!(
            (e[1].grants - 5.0).abs() < 1e-6 && (e[2].grants - 5.0).abs() < 1e-6,
            "{e:?}"
        );
    }

    #[test]
    fn shapes_keep_names_and_types_not_values() {
        assert_eq!(
            shape(Some(r#"{"suite":"unit","n":3,"v":true}"#)),
            "{n:number,suite:string,v:boolean}"
        );
        assert_eq!(
            shape(Some(r#"{"suite":"other","n":4.5,"v":false}"#)),
            shape(Some(r#"{"v":true,"n":1,"suite":"unit"}"#))
        );
        assert_eq!(
            shape(Some(r#"{"o":{"force":true},"a":[1],"z":null}"#)),
            "{a:array,o:{force:boolean},z:null}"
        );
        assert_eq!(shape(None), "{}");
        assert_eq!(shape(Some("{}")), "{}");
        assert_eq!(shape(Some("nope")), "?");
        // Names that could fake the notation are quoted.
        assert_eq!(
            shape(Some(r#"{"a:string,b":1}"#)),
            r#"{"a:string,b":number}"#
        );
        assert_ne!(
            shape(Some(r#"{"a:string,b":1}"#)),
            shape(Some(r#"{"a":"x","b":1}"#))
        );
        // Deep objects stop describing; long shapes become a digest.
        assert_eq!(
            shape(Some(r#"{"a":{"b":{"c":{"d":{"e":1}}}}}"#)),
            "{a:{b:{c:{d:object}}}}"
        );
        let wide: String = format!(
            "{{{}}}",
            (0..200)
                .map(|i| format!("\"k{i}\":1"))
                .collect::<Vec<_>>()
                .join(",")
        );
        let s = shape(Some(&wide));
        assert!(s.starts_with('#') && s.len() == 17, "{s}");
    }

    #[test]
    fn keys_do_not_run_into_each_other() {
        assert_ne!(key(&["a:b", "c"]), key(&["a", "b:c"]));
        assert_ne!(key(&["1:a", ""]), key(&["", "1:a"]));
    }

    #[test]
    fn probabilities_read_short() {
        assert_eq!(prob(0.99), "0.99");
        assert_eq!(prob(100.0 / 105.0), "0.9524");
        assert_eq!(prob(0.0), "0");
        assert_eq!(prob(1.0), "1");
    }

    #[test]
    fn counts_read_as_people_count() {
        assert_eq!(count(42.0), "42");
        assert_eq!(count(41.99), "42");
        assert_eq!(count(5.5), "5.5");
    }
}
