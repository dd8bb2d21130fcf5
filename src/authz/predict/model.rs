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
//!   answers decides: exact (caller, credential, tool, argument shape) →
//!   (caller, tool) → (tool). Two rules keep the back-off from speaking
//!   for anyone it should not: the (tool) level, which pools every
//!   caller's answers, may deny or ask but never allow (one agent's grants
//!   never let another agent's calls through); and a denial recorded at a
//!   more specific level than the deciding one blocks an allow (answers
//!   about this very shape are not drowned by answers about others).

use std::collections::HashMap;

pub use crate::config::{CostError, Costs, Thresholds};

/// The one-sided credible level of the bounds.
pub const CREDIBLE: f64 = 0.95;
/// The (decayed) answers a level needs before it decides rather than
/// backing off to a less specific one.
pub const MIN_EVIDENCE: f64 = 3.0;
/// A decayed weight below this counts as no answer at all (a denial
/// forgotten to a hundredth does not block).
const NEGLIGIBLE: f64 = 0.5;

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
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Tally {
    grants: f64,
    denials: f64,
    /// Unix milliseconds the weights are as of.
    at: i64,
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
        } else {
            self.denials += w;
        }
    }

    /// (grants, denials) weighed as of `now` (never more than recorded:
    /// a clock behind the newest answer does not inflate them).
    fn at(&self, now: i64, half_life_ms: f64) -> (f64, f64) {
        let k = decay(now - self.at, half_life_ms);
        (self.grants * k, self.denials * k)
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
    /// The one-sided [`CREDIBLE`] bounds of the probability of approval,
    /// when computed: a prediction computes only the one its action rests
    /// on (each is an inverse incomplete beta, the costliest step);
    /// [`Model::explain`] computes all.
    pub lower: Option<f64>,
    pub upper: Option<f64>,
}

impl Evidence {
    fn of(level: Level, grants: f64, denials: f64) -> Evidence {
        Evidence {
            level,
            grants,
            denials,
            lower: None,
            upper: None,
        }
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

    fn answers(&self) -> f64 {
        self.grants + self.denials
    }
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
}

impl Prediction {
    /// One short line: `would allow: p 0.762 from 10 grants, 0 denials at
    /// exact (allow above 0.75, deny below 0.2)`.
    pub fn summary(&self) -> String {
        let t = &self.thresholds;
        let bounds = format!("allow above {}, deny below {}", prob(t.allow), prob(t.deny));
        match (self.evidence(), self.p) {
            (Some(e), Some(p)) => format!(
                "would {}: p {p:.3} from {} grants, {} denials at {} ({bounds})",
                self.action.as_str(),
                count(e.grants),
                count(e.denials),
                e.level.as_str()
            ),
            _ => format!("would {}: too few answers ({bounds})", self.action.as_str()),
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
            map.get(&k).map_or((0.0, 0.0), |t| t.at(now, hl))
        };
        let (eg, ed) = get(&self.exact, key(&[s.caller, s.credential, s.tool, s.shape]));
        let (cg, cd) = get(&self.caller_tool, key(&[s.caller, s.tool]));
        let (tg, td) = get(&self.tool, key(&[s.tool]));
        [
            Evidence::of(Level::Exact, eg, ed),
            Evidence::of(Level::CallerTool, cg, cd),
            Evidence::of(Level::Tool, tg, td),
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
    let deciding = levels.iter().position(|e| e.answers() >= MIN_EVIDENCE);
    let (action, p) = match deciding {
        None => (Action::Ask, None),
        Some(i) => {
            let denied_closer = levels[..i].iter().any(|m| m.denials >= NEGLIGIBLE);
            let e = &mut levels[i];
            if e.level != Level::Tool && !denied_closer && e.surely_above(t.allow) {
                let lower = e.lower();
                e.lower = Some(lower);
                (Action::Allow, Some(lower))
            } else if e.surely_below(t.deny) {
                let upper = e.upper();
                e.upper = Some(upper);
                (Action::Deny, Some(upper))
            } else {
                let mean = (1.0 + e.grants) / (2.0 + e.answers());
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
        // Another shape of the same caller's tool: (caller, tool) decides.
        let p = learnt.predict(&subject("agent", "run_tests", "{suite:number}"), &th, 10);
        assert_eq!(
            (p.action, p.level),
            (Action::Allow, Some(Level::CallerTool))
        );
        // Another credential counts at (caller, tool) alone too.
        let other = Subject {
            credential: "gl",
            ..subject("agent", "run_tests", "{suite:string}")
        };
        assert_eq!(
            learnt.predict(&other, &th, 10).level,
            Some(Level::CallerTool)
        );
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
    fn a_closer_denial_blocks_an_allow_from_further_out() {
        let th = t(0.75, 0.2);
        let mut a = grants(30, "agent", "run_tests", "{suite:string}");
        a.push(answer("agent", "run_tests", "{shell:string}", false, 40));
        let m = model(&a);
        // The exact level (one denial) has too little to decide, and the
        // (caller, tool) level would allow: the denial blocks it.
        let p = m.predict(&subject("agent", "run_tests", "{shell:string}"), &th, 41);
        assert_eq!(
            (p.action, p.level),
            (Action::Ask, Some(Level::CallerTool)),
            "{p:?}"
        );
        // The shapes people granted are still allowed.
        let p = m.predict(&subject("agent", "run_tests", "{suite:string}"), &th, 41);
        assert_eq!(p.action, Action::Allow);
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
