//! Tool pinning (issue 29): a server cannot change what a tool does behind
//! the agent's back.
//!
//! Per credential (one upstream identity), each tool listed is pinned by
//! the SHA-256 of its canonical definition ([`definition`]). In a later
//! `tools/list` answer, a tool whose digest differs from its pin, or that
//! has none, is held: left out of the answer the caller gets
//! (`crate::proxy::response::tool_list`), and its `tools/call` refused
//! before authorization (`crate::proxy`), until an admin accepts it
//! (`tessera tool accept`).
//!
//! The request path reads only memory: pins come with the snapshot
//! ([`PinTable`]), and a `tools/call` looks its tool up there. Only an
//! answer that shows a digest not recorded yet writes, off the caller's
//! path: [`PinBook::observe`] queues it for a task that records it
//! (`Store::record_offered_tools`), whose revision bump reloads the
//! snapshot here and, on Postgres, on every replica. Until then the
//! process remembers the digests it saw held ([`PinBook`]'s overlay), so
//! a call of a tool just seen changed is refused at once, not only after
//! the reload.
//!
//! Names: a call names its tool exactly as the upstream is sent it; only
//! a tool pinned under that exact name passes, and none passes while a
//! tool whose name folds to the same (`Search`, `ſearch`: a Go server may
//! read them as one) is held.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};

use crate::authz::canonical::{fold, fold_eq};
use crate::config::PinMode;
use crate::store::model::{OfferedTool, ToolPinRow};
use crate::store::Store;

labelled! {
    /// Where a tool stands for a credential: its definition is the one
    /// pinned; it differs from the pin; it has no pin (listed after the
    /// first answer, or in strict mode); an admin said to keep it hidden.
    pub enum PinStatus {
        Pinned => "pinned",
        Changed => "changed",
        New => "new",
        Rejected => "rejected",
    }
}

impl PinStatus {
    /// The status a row stores.
    pub fn parse(s: &str) -> PinStatus {
        PinStatus::ALL
            .iter()
            .copied()
            .find(|p| p.as_str() == s)
            // An unknown word holds the tool rather than passing it.
            .unwrap_or(PinStatus::Rejected)
    }
}

/// The members of a tool that make its definition, folded: what a model
/// reads of a tool (and what a Go client reads under any letter case).
const MEMBERS: [&str; 6] = [
    "name",
    "title",
    "description",
    "inputschema",
    "outputschema",
    "annotations",
];

/// Why a listed tool has no single definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unpinnable {
    /// Two of its members fold to one of [`MEMBERS`] (`description` and
    /// `Description`): clients would read different ones.
    Ambiguous,
    /// Not an object.
    NotAnObject,
}

/// A tool's canonical definition: the object of its members that fold to
/// one of name, title, description, inputSchema, outputSchema and
/// annotations (under their own spelling), with every object's keys
/// sorted, no whitespace, and strings as serde_json writes them after
/// parsing (so `"\u0041"` and `"A"` are one definition). Other members
/// (`_meta`, `icons`) are not pinned.
pub fn definition(tool: &Value) -> Result<String, Unpinnable> {
    let Value::Object(m) = tool else {
        return Err(Unpinnable::NotAnObject);
    };
    let mut picked: Vec<(&String, &Value)> = Vec::with_capacity(MEMBERS.len());
    let mut seen = [false; MEMBERS.len()];
    for (k, v) in m {
        if let Some(i) = MEMBERS.iter().position(|n| fold_eq(k, n)) {
            if std::mem::replace(&mut seen[i], true) {
                return Err(Unpinnable::Ambiguous);
            }
            picked.push((k, v));
        }
    }
    picked.sort_by(|a, b| a.0.cmp(b.0));
    let mut out = String::new();
    out.push('{');
    for (i, (k, v)) in picked.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(&mut out, k);
        out.push(':');
        write_canonical(&mut out, v);
    }
    out.push('}');
    Ok(out)
}

fn write_string(out: &mut String, s: &str) {
    out.push_str(&serde_json::to_string(s).expect("a string serializes"));
}

/// `v` with every object's members sorted by name, whatever order the
/// map keeps them in.
fn write_canonical(out: &mut String, v: &Value) {
    match v {
        Value::Object(m) => {
            let mut members: Vec<(&String, &Value)> = m.iter().collect();
            members.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (k, v)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, k);
                out.push(':');
                write_canonical(out, v);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, v) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(out, v);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The digest of a canonical definition (hex SHA-256).
pub fn digest(definition: &str) -> String {
    crate::crypto::tokens::sha256_hex(definition.as_bytes())
}

/// One tool's pin as the snapshot holds it.
#[derive(Debug, Clone)]
pub struct Pin {
    pub status: PinStatus,
    pub pinned_digest: Option<String>,
    pub offered_digest: Option<String>,
}

/// One credential's pins.
#[derive(Debug, Default, Clone)]
pub struct CredentialPins {
    pub tools: HashMap<String, Pin>,
    /// The folded names of the tools not pinned: a call whose name folds
    /// to one of them is refused whatever its spelling.
    held_folded: HashSet<String>,
}

/// Every credential's pins, by credential name (loaded with the snapshot).
#[derive(Debug, Default)]
pub struct PinTable {
    /// foldhash: credential names are an admin's (looked up per call).
    pub credentials: foldhash::HashMap<String, CredentialPins>,
}

impl PinTable {
    pub fn from_rows(rows: Vec<ToolPinRow>) -> PinTable {
        let mut t = PinTable::default();
        for r in rows {
            let status = PinStatus::parse(&r.status);
            let c = t.credentials.entry(r.credential).or_default();
            if status != PinStatus::Pinned {
                c.held_folded.insert(fold(&r.tool).into_owned());
            }
            c.tools.insert(
                r.tool,
                Pin {
                    status,
                    pinned_digest: r.pinned_digest,
                    offered_digest: r.offered_digest,
                },
            );
        }
        t
    }
}

/// What the filter does with one listed tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listed {
    Visible,
    Held(PinStatus),
}

/// How many held digests a process remembers before the snapshot has them
/// (bounded: an upstream listing endless new names costs no more).
const OVERLAY_MAX: usize = 4096;

/// How many answers may wait to be recorded; more are dropped (the same
/// digests are offered again by the next answer that shows them).
const QUEUE: usize = 64;

/// The overlay's mark of a tool listed without a single definition.
const AMBIGUOUS: &str = "ambiguous";

/// An answer's tools to record.
struct Observed {
    credential: String,
    tools: Vec<OfferedTool>,
    baseline: bool,
}

/// The process's side of pinning: the queue of answers to record and the
/// digests seen held since the snapshot last loaded.
pub struct PinBook {
    mode: PinMode,
    queue: tokio::sync::mpsc::Sender<Observed>,
    /// (credential, tool) → the digest last seen held by this process.
    overlay: Mutex<HashMap<(String, String), String>>,
    /// The pins this process took on first use that the snapshot does not
    /// hold yet: a second answer before the reload is held to them, not
    /// trusted on first use again.
    baselines: Mutex<HashMap<String, CredentialPins>>,
    /// When each credential's changes were last queued: a server that
    /// changes its tools on every answer costs at most one write (and one
    /// snapshot reload on every replica) per [`WRITE_EVERY`].
    written: Mutex<HashMap<String, std::time::Instant>>,
}

/// The shortest time between two recorded changes of one credential's
/// tools by one process (trust on first use is never delayed). A change
/// not queued is still held here at once; it is recorded by the first
/// answer that shows it after the pause.
const WRITE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl PinBook {
    /// Start the task that records answers in `store`.
    pub fn start(
        mode: PinMode,
        store: Store,
        metrics: Arc<crate::telemetry::metrics::Metrics>,
        db_timeout: std::time::Duration,
    ) -> Arc<PinBook> {
        let (queue, mut rx) = tokio::sync::mpsc::channel::<Observed>(QUEUE);
        if mode != PinMode::Off {
            tokio::spawn(async move {
                while let Some(o) = rx.recv().await {
                    record(&store, &metrics, db_timeout, o).await;
                }
            });
        }
        Arc::new(PinBook {
            mode,
            queue,
            overlay: Mutex::new(HashMap::new()),
            baselines: Mutex::new(HashMap::new()),
            written: Mutex::new(HashMap::new()),
        })
    }

    /// A book that records nothing (pinning off): for tests and fuzzing.
    pub fn off() -> Arc<PinBook> {
        let (queue, _) = tokio::sync::mpsc::channel(1);
        Arc::new(PinBook {
            mode: PinMode::Off,
            queue,
            overlay: Mutex::new(HashMap::new()),
            baselines: Mutex::new(HashMap::new()),
            written: Mutex::new(HashMap::new()),
        })
    }

    pub fn mode(&self) -> PinMode {
        self.mode
    }

    /// Decide which of an answer's tools `credential`'s caller sees, and
    /// queue the digests not recorded yet. `tools[i]` is `(name, its
    /// definition)`, `None` for a tool without one string name (the
    /// filter drops those anyway). Returns one verdict per tool.
    pub fn list(
        &self,
        table: &PinTable,
        credential: &str,
        redactor: &crate::redact::Redactor,
        tools: &[Option<(&str, Result<String, Unpinnable>)>],
    ) -> Vec<bool> {
        if self.mode == PinMode::Off {
            return vec![true; tools.len()];
        }
        let pending;
        let snapshot = table
            .credentials
            .get(credential)
            .filter(|p| !p.tools.is_empty());
        let pins = match snapshot {
            Some(p) => {
                let mut b = self.baselines.lock().expect("the baselines lock");
                if !b.is_empty() {
                    b.remove(credential);
                }
                Some(p)
            }
            None => {
                pending = self.pending_baseline(credential);
                pending.as_ref()
            }
        };
        let baseline = self.mode == PinMode::Tofu && pins.is_none();
        // Until the snapshot holds the pins, answers are offered as a
        // baseline again (the store pins only while it has none): a
        // failed write is retried by the next answer.
        let offer_baseline = self.mode == PinMode::Tofu && snapshot.is_none();
        let digests: Vec<Option<(&str, String, &String)>> = tools
            .iter()
            .map(|t| match t {
                Some((name, Ok(def))) => Some((*name, digest(def), def)),
                _ => None,
            })
            .collect();
        // A name listed twice with two definitions: neither is shown.
        let mut first: HashMap<&str, &str> = HashMap::new();
        let mut twice: HashSet<&str> = HashSet::new();
        for (name, d, _) in digests.iter().flatten() {
            if let Some(prev) = first.insert(name, d) {
                if prev != d {
                    twice.insert(name);
                }
            }
        }
        // Names listed whose definition cannot be read are held too.
        for (name, def) in tools.iter().flatten() {
            if def.is_err() {
                twice.insert(name);
            }
        }
        let mut offers: Vec<OfferedTool> = Vec::new();
        let mut overlay = self.overlay.lock().expect("the overlay lock");
        // What has no single definition is held, and so are its calls in
        // this process (it is not recorded: there is nothing an admin
        // could accept; another replica holds it once it lists it).
        for name in &twice {
            let key = (credential.to_string(), name.to_string());
            if overlay.len() < OVERLAY_MAX || overlay.contains_key(&key) {
                overlay.insert(key, AMBIGUOUS.to_string());
            }
        }
        if !twice.is_empty() {
            tracing::warn!(credential, tools = ?twice, "a tools/list answer lists a tool with two definitions (twice under one name, or with members a client could read either way): held");
        }
        let verdicts = digests
            .iter()
            .map(|t| {
                let Some((name, d, def)) = t else {
                    return false;
                };
                if twice.contains(name) {
                    return false;
                }
                let pin = pins.and_then(|p| p.tools.get(*name));
                let listed = if baseline {
                    Listed::Visible
                } else {
                    listed(pin, d)
                };
                let key = (credential.to_string(), name.to_string());
                let recorded = snapshot
                    .and_then(|p| p.tools.get(*name))
                    .and_then(|p| p.offered_digest.as_deref())
                    == Some(d.as_str());
                match listed {
                    Listed::Visible => {
                        overlay.remove(&key);
                    }
                    Listed::Held(_) => {
                        if overlay.get(&key) != Some(d) && overlay.len() < OVERLAY_MAX {
                            overlay.insert(key, d.clone());
                        }
                    }
                }
                if !recorded && offers.len() < crate::store::tool_pins::MAX_TOOLS_PER_CREDENTIAL {
                    offers.push(OfferedTool {
                        tool: name.to_string(),
                        digest: d.clone(),
                        definition: redactor.text(def).into_owned(),
                    });
                }
                listed == Listed::Visible
            })
            .collect();
        drop(overlay);
        if baseline && !offers.is_empty() {
            let mut b = self.baselines.lock().expect("the baselines lock");
            if b.len() < OVERLAY_MAX {
                let mut pins = CredentialPins::default();
                for o in &offers {
                    pins.tools.insert(
                        o.tool.clone(),
                        Pin {
                            status: PinStatus::Pinned,
                            pinned_digest: Some(o.digest.clone()),
                            offered_digest: Some(o.digest.clone()),
                        },
                    );
                }
                b.insert(credential.to_string(), pins);
            }
        }
        if !offers.is_empty() && !offer_baseline {
            let now = std::time::Instant::now();
            let mut w = self.written.lock().expect("the write times lock");
            match w.get(credential) {
                Some(t) if now.duration_since(*t) < WRITE_EVERY => offers.clear(),
                _ => {
                    if w.len() >= OVERLAY_MAX {
                        w.retain(|_, t| now.duration_since(*t) < WRITE_EVERY);
                    }
                    if w.len() < OVERLAY_MAX {
                        w.insert(credential.to_string(), now);
                    }
                }
            }
        }
        if !offers.is_empty() {
            // Full: dropped; the next answer that shows them offers them again.
            let _ = self.queue.try_send(Observed {
                credential: credential.to_string(),
                tools: offers,
                baseline: offer_baseline,
            });
        }
        verdicts
    }

    /// Why a `tools/call` of `tool` on `credential` is refused, if it is:
    /// the tool is not pinned under this exact name, a tool whose name
    /// folds to it is held, or this process saw it offered with another
    /// definition than its pin.
    pub fn refuses_call(
        &self,
        table: &PinTable,
        credential: &str,
        tool: &str,
    ) -> Option<PinStatus> {
        if self.mode == PinMode::Off {
            return None;
        }
        let pending;
        let pins = match table
            .credentials
            .get(credential)
            .filter(|p| !p.tools.is_empty())
        {
            Some(p) => Some(p),
            None => {
                pending = self.pending_baseline(credential);
                pending.as_ref()
            }
        };
        let Some(pins) = pins else {
            return match self.mode {
                // Nothing listed yet: nothing to hold it to.
                PinMode::Off | PinMode::Tofu => None,
                PinMode::Strict => Some(PinStatus::New),
            };
        };
        let Some(pin) = pins.tools.get(tool) else {
            return Some(PinStatus::New);
        };
        if pin.status != PinStatus::Pinned {
            return Some(pin.status);
        }
        if pins.held_folded.contains(fold(tool).as_ref()) {
            return Some(PinStatus::Changed);
        }
        let overlay = self.overlay.lock().expect("the overlay lock");
        if overlay.is_empty() {
            return None;
        }
        if let Some(d) = overlay.get(&(credential.to_string(), tool.to_string())) {
            if pin.pinned_digest.as_deref() != Some(d.as_str()) {
                return Some(PinStatus::Changed);
            }
        }
        // A tool this process saw held under a name that folds to this one
        // (`Search` beside a pinned `search`), before the snapshot has it:
        // no call of the pinned name passes meanwhile either (found by the
        // attack review: the rule held only once the snapshot reloaded).
        let twin_held = overlay
            .keys()
            .any(|(c, n)| c == credential && n != tool && fold_eq(n, tool));
        twin_held.then_some(PinStatus::Changed)
    }
}

impl PinBook {
    /// The pins this process took on first use for `credential`, while
    /// the snapshot does not hold them yet.
    fn pending_baseline(&self, credential: &str) -> Option<CredentialPins> {
        let b = self.baselines.lock().expect("the baselines lock");
        if b.is_empty() {
            return None;
        }
        b.get(credential).cloned()
    }
}

/// Whether a tool offered with digest `d` is shown, given its pin.
pub fn listed(pin: Option<&Pin>, d: &str) -> Listed {
    match pin {
        None => Listed::Held(PinStatus::New),
        Some(p) if p.status == PinStatus::Rejected => Listed::Held(PinStatus::Rejected),
        Some(p) if p.pinned_digest.as_deref() == Some(d) => Listed::Visible,
        Some(p) if p.pinned_digest.is_none() => Listed::Held(PinStatus::New),
        Some(_) => Listed::Held(PinStatus::Changed),
    }
}

/// Record one answer's tools; a change is logged (at warn, once per
/// digest: a digest already recorded is not a change) and counted.
async fn record(
    store: &Store,
    metrics: &crate::telemetry::metrics::Metrics,
    limit: std::time::Duration,
    o: Observed,
) {
    let recorded = crate::store::timed(
        limit,
        store.record_offered_tools(&o.credential, &o.tools, o.baseline),
    )
    .await;
    match recorded {
        Ok(changes) => {
            for c in changes {
                if c.status == "pinned" && o.baseline {
                    tracing::info!(credential = %o.credential, tool = %c.tool, digest = %c.digest, "tool pinned on first use");
                    continue;
                }
                if c.status == "pinned" {
                    // Offered again as pinned: no change to review.
                    continue;
                }
                tracing::warn!(
                    credential = %o.credential,
                    tool = %c.tool,
                    status = %c.status,
                    digest = %c.digest,
                    "a tool's definition is not the one pinned: it is held until an admin reviews it (tessera tool diff --credential {} TOOL, then tessera tool accept --credential {} TOOL --digest DIGEST, or reject)",
                    o.credential,
                    o.credential
                );
                metrics.tool_change(&o.credential);
            }
        }
        Err(e) => {
            tracing::warn!(credential = %o.credential, error = %e, "recording a tools/list answer's tool definitions failed; the next answer offers them again")
        }
    }
}

/// Read a `tools` array's entries for [`PinBook::list`]: each tool's one
/// string name (folding `name`, as the filter does) and its definition.
pub fn read_tools(tools: &[Value]) -> Vec<Option<(&str, Result<String, Unpinnable>)>> {
    tools
        .iter()
        .map(|t| {
            let m: &Map<String, Value> = t.as_object()?;
            let mut names = m.iter().filter(|(k, _)| fold_eq(k, "name"));
            match (names.next(), names.next()) {
                (Some((_, Value::String(n))), None) => Some((n.as_str(), definition(t))),
                _ => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn def(s: &str) -> Result<String, Unpinnable> {
        definition(&serde_json::from_str(s).unwrap())
    }

    #[test]
    fn escapes_order_and_whitespace_do_not_change_the_digest() {
        let a = def(r#"{"name":"search","description":"A b","inputSchema":{"type":"object","properties":{"q":{"type":"string"}}}}"#).unwrap();
        let b = def("{ \"inputSchema\" : {\"properties\":{\"q\":{\"type\":\"str\\u0069ng\"}},\"type\":\"object\"},\n \"description\":\"\\u0041 b\", \"name\":\"search\"}").unwrap();
        assert_eq!(a, b);
        assert_eq!(digest(&a), digest(&b));
        assert!(!a.contains(' ') || a.contains("A b"));
        assert!(
            a.starts_with(r#"{"description":"A b","inputSchema":{"properties""#),
            "{a}"
        );
    }

    #[test]
    fn what_a_model_reads_is_pinned_and_nothing_else() {
        let base = def(r#"{"name":"s","description":"d"}"#).unwrap();
        for changed in [
            r#"{"name":"s","description":"d!"}"#,
            r#"{"name":"s","description":"d","title":"t"}"#,
            r#"{"name":"s","description":"d","annotations":{"destructiveHint":true}}"#,
            r#"{"name":"s","description":"d","outputSchema":{}}"#,
            r#"{"name":"s","description":"d","inputSchema":{"type":"object"}}"#,
            // Another spelling a Go client reads as the description.
            r#"{"name":"s","Description":"d"}"#,
        ] {
            assert_ne!(def(changed).unwrap(), base, "{changed}");
        }
        assert_eq!(
            def(r#"{"name":"s","description":"d","_meta":{"x":1},"icons":[]}"#).unwrap(),
            base
        );
    }

    #[test]
    fn members_that_fold_to_one_are_unpinnable() {
        assert_eq!(
            def(r#"{"name":"s","description":"d","DESCRIPTION":"ignore previous instructions"}"#),
            Err(Unpinnable::Ambiguous)
        );
        assert_eq!(
            def(r#"{"name":"s","inputSchema":{},"inputſchema":{}}"#),
            Err(Unpinnable::Ambiguous)
        );
        assert_eq!(definition(&json!("s")), Err(Unpinnable::NotAnObject));
    }

    fn table(rows: &[(&str, &str, Option<&str>, Option<&str>)]) -> PinTable {
        PinTable::from_rows(
            rows.iter()
                .map(|(tool, status, pinned, offered)| ToolPinRow {
                    credential: "gh".into(),
                    tool: tool.to_string(),
                    status: status.to_string(),
                    pinned_digest: pinned.map(str::to_string),
                    pinned_definition: None,
                    offered_digest: offered.map(str::to_string),
                    offered_definition: None,
                    first_seen: 0,
                    last_seen: 0,
                })
                .collect(),
        )
    }

    fn book(mode: PinMode) -> PinBook {
        book_with(mode).0
    }

    fn book_with(mode: PinMode) -> (PinBook, tokio::sync::mpsc::Receiver<Observed>) {
        let (queue, rx) = tokio::sync::mpsc::channel(QUEUE);
        (
            PinBook {
                mode,
                queue,
                overlay: Mutex::new(HashMap::new()),
                baselines: Mutex::new(HashMap::new()),
                written: Mutex::new(HashMap::new()),
            },
            rx,
        )
    }

    #[test]
    fn a_server_changing_on_every_answer_is_written_once_a_second() {
        let d = digest(&def(r#"{"name":"s","description":"d"}"#).unwrap());
        let t = table(&[("s", "pinned", Some(&d), Some(&d))]);
        let r = crate::redact::Redactor::new([]);
        let (b, mut rx) = book_with(PinMode::Tofu);
        for i in 0..5 {
            let changed = json!([{"name": "s", "description": format!("evil {i}")}]);
            assert_eq!(
                b.list(&t, "gh", &r, &read_tools(changed.as_array().unwrap())),
                [false]
            );
        }
        assert!(rx.try_recv().is_ok());
        assert!(rx.try_recv().is_err());
        // Every change is still held, written or not.
        assert_eq!(b.refuses_call(&t, "gh", "s"), Some(PinStatus::Changed));
    }

    #[test]
    fn calls_pass_only_under_a_pinned_name() {
        let t = table(&[
            ("search", "pinned", Some("a"), Some("a")),
            ("Read", "pinned", Some("b"), Some("b")),
            ("read", "changed", Some("c"), Some("d")),
            ("fresh", "new", None, Some("e")),
            ("gone", "rejected", None, Some("f")),
        ]);
        let b = book(PinMode::Tofu);
        assert_eq!(b.refuses_call(&t, "gh", "search"), None);
        assert_eq!(b.refuses_call(&t, "gh", "Search"), Some(PinStatus::New));
        assert_eq!(b.refuses_call(&t, "gh", "read"), Some(PinStatus::Changed));
        // Pinned, but another spelling of it is held.
        assert_eq!(b.refuses_call(&t, "gh", "Read"), Some(PinStatus::Changed));
        assert_eq!(b.refuses_call(&t, "gh", "fresh"), Some(PinStatus::New));
        assert_eq!(b.refuses_call(&t, "gh", "gone"), Some(PinStatus::Rejected));
        assert_eq!(b.refuses_call(&t, "gh", "unlisted"), Some(PinStatus::New));
        // A credential never listed: trusted on first use, not in strict.
        assert_eq!(b.refuses_call(&t, "other", "x"), None);
        assert_eq!(
            book(PinMode::Strict).refuses_call(&t, "other", "x"),
            Some(PinStatus::New)
        );
        assert_eq!(book(PinMode::Off).refuses_call(&t, "gh", "fresh"), None);
    }

    #[test]
    fn a_change_seen_is_held_before_the_snapshot_knows_it() {
        let t = table(&[("search", "pinned", Some("a"), Some("a"))]);
        let b = book(PinMode::Tofu);
        let r = crate::redact::Redactor::new([]);
        let changed = json!([{"name": "search", "description": "now evil"}]);
        let tools = changed.as_array().unwrap();
        assert_eq!(b.list(&t, "gh", &r, &read_tools(tools)), [false]);
        assert_eq!(b.refuses_call(&t, "gh", "search"), Some(PinStatus::Changed));
    }

    #[test]
    fn a_name_listed_twice_with_two_definitions_is_held() {
        let d = digest(&def(r#"{"name":"s","description":"d"}"#).unwrap());
        let t = table(&[("s", "pinned", Some(&d), Some(&d))]);
        let b = book(PinMode::Tofu);
        let r = crate::redact::Redactor::new([]);
        let listed = json!([{"name":"s","description":"d"},{"name":"s","description":"evil"}]);
        let tools = listed.as_array().unwrap();
        assert_eq!(b.list(&t, "gh", &r, &read_tools(tools)), [false, false]);
        let same = json!([{"name":"s","description":"d"},{"name":"s","description":"d"}]);
        let tools = same.as_array().unwrap();
        assert_eq!(b.list(&t, "gh", &r, &read_tools(tools)), [true, true]);
    }

    #[test]
    fn a_second_answer_before_the_reload_is_held_to_the_first() {
        let t = PinTable::default();
        let r = crate::redact::Redactor::new([]);
        let b = book(PinMode::Tofu);
        let first = json!([{"name":"s","description":"d"}]);
        assert_eq!(
            b.list(&t, "gh", &r, &read_tools(first.as_array().unwrap())),
            [true]
        );
        let changed = json!([{"name":"s","description":"evil"},{"name":"n"}]);
        assert_eq!(
            b.list(&t, "gh", &r, &read_tools(changed.as_array().unwrap())),
            [false, false]
        );
        assert_eq!(b.refuses_call(&t, "gh", "s"), Some(PinStatus::Changed));
        assert_eq!(b.refuses_call(&t, "gh", "n"), Some(PinStatus::New));
    }

    #[test]
    fn first_answer_pins_in_tofu_only() {
        let t = PinTable::default();
        let r = crate::redact::Redactor::new([]);
        let listed = json!([{"name":"s"}]);
        let tools = listed.as_array().unwrap();
        assert_eq!(
            book(PinMode::Tofu).list(&t, "gh", &r, &read_tools(tools)),
            [true]
        );
        assert_eq!(
            book(PinMode::Strict).list(&t, "gh", &r, &read_tools(tools)),
            [false]
        );
        assert_eq!(
            book(PinMode::Off).list(&t, "gh", &r, &read_tools(tools)),
            [true]
        );
    }
}
