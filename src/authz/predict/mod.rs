//! Approvals that learn: for a call an `@ask("learn")` permit holds,
//! predict whether a person would approve it and take the action of least
//! expected cost (allow, deny, or ask a person), failing closed.
//!
//! - [`model`] is the built-in model (a Beta–Binomial per key, with
//!   back-off and forgetting) and the rule from costs to thresholds.
//! - [`Predictor`] runs a prediction for the serving process: the model
//!   brought up to date with the store's evidence (only what is new), or
//!   the operator's own service (`--predictor-url`), in a task of its own
//!   behind `--predict-timeout-ms`. Whatever goes wrong — a deadline, a
//!   store error, a refused or garbled answer, a panic — is
//!   [`Outcome::Failed`], which the request path treats as **ask**: never
//!   an allow.
//!
//! Only a person's own answers are evidence (`crate::store::evidence`):
//! calls allowed or denied here never feed the model.

pub mod model;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Uri};

pub use crate::config::{
    PredictSettings as Settings, DEFAULT_HALF_LIFE, DEFAULT_PREDICT_TIMEOUT as DEFAULT_TIMEOUT,
};
pub use model::{Action, Costs, Level, Prediction, Subject, Thresholds};

use crate::store::Store;
use crate::upstream::pool::UpstreamClient;

/// The largest answer read from a predictor.
const MAX_ANSWER_BYTES: usize = 16 * 1024;
/// The longest reason kept from a predictor (it reaches the audit trail).
const MAX_REASON_CHARS: usize = 200;

/// A held call, as a prediction sees it: no argument values unless
/// `--audit-arguments` (and then only for the operator's predictor).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Question {
    pub caller: String,
    pub connection: String,
    pub credential: String,
    pub tool: String,
    pub rpc_method: String,
    /// The arguments' names and JSON types ([`model::shape`]).
    pub shape: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Box<serde_json::value::RawValue>>,
}

impl Question {
    fn subject(&self) -> Subject<'_> {
        Subject {
            caller: &self.caller,
            credential: &self.credential,
            tool: &self.tool,
            shape: &self.shape,
        }
    }
}

/// What became of a prediction.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// By the built-in model.
    Model(Prediction),
    /// By the operator's predictor: its p, its reason, and the action.
    Service {
        action: Action,
        p: f64,
        reason: Option<String>,
        thresholds: Thresholds,
    },
    /// No prediction (the reason, for the record): a person is asked.
    Failed(String),
    /// Not predicted again: this very call was denied by prediction
    /// before, and its retry is for a person.
    Retried,
}

impl Outcome {
    /// The action to take: a failure asks.
    pub fn action(&self) -> Action {
        match self {
            Outcome::Model(p) => p.action,
            Outcome::Service { action, .. } => *action,
            Outcome::Failed(_) | Outcome::Retried => Action::Ask,
        }
    }

    /// Why, in one line for the audit trail and the approval: for
    /// example `predicted approval 0.995 > 0.99 from 42 grants, 0 denials
    /// at exact (caller agent-1, tool run_tests, shape {suite:string})`.
    /// `q`'s tool and shape are the agent's words: the caller redacts the
    /// line as it redacts anything else it writes.
    pub fn reason(&self, q: &Question) -> String {
        let about = format!("caller {}, tool {}, shape {}", q.caller, q.tool, q.shape);
        match self {
            Outcome::Failed(why) => format!("prediction failed ({why}): a person decides"),
            Outcome::Retried => {
                "denied by prediction before: this retry is held for a person".into()
            }
            Outcome::Service {
                action,
                p,
                reason,
                thresholds,
            } => {
                let why = reason
                    .as_deref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default();
                format!(
                    "{} by the predictor ({about}){why}",
                    verdict_text(*action, Some(*p), thresholds)
                )
            }
            Outcome::Model(p) => format!("{} ({about})", p.grounds()),
        }
    }
}

/// The operator's predictor's verdict: its p, as compared.
fn verdict_text(action: Action, p: Option<f64>, t: &Thresholds) -> String {
    let p = p.map_or_else(|| "unknown".to_string(), |p| format!("{p:.3}"));
    let (allow, deny) = (model::prob(t.allow), model::prob(t.deny));
    match action {
        Action::Allow => format!("predicted approval {p} > {allow}"),
        Action::Deny => format!("predicted denial: approval {p} < {deny}"),
        Action::Ask => {
            format!("predicted approval {p}, not above {allow} nor below {deny}: a person decides")
        }
    }
}

/// The built-in model as of the store's evidence read so far.
struct Loaded {
    model: model::Model,
    /// The last evidence row folded in.
    last: i64,
    /// The evidence generation it was read at (`None`: not read yet).
    generation: Option<i64>,
}

/// Predictions for the serving process.
pub struct Predictor {
    settings: Settings,
    thresholds: Thresholds,
    store: Store,
    loaded: tokio::sync::Mutex<Loaded>,
    service: Option<Service>,
    in_flight: Arc<AtomicUsize>,
}

/// The operator's predictor.
struct Service {
    client: UpstreamClient,
    uri: Uri,
    host: HeaderValue,
}

impl Predictor {
    /// Must be called inside a Tokio runtime when `settings.url` is set
    /// (its client sweeps idle connections in a task). The thresholds were
    /// checked with the settings (`crate::config`).
    pub fn new(
        settings: Settings,
        store: Store,
        connect_timeout: Duration,
        roots: rustls::RootCertStore,
    ) -> Predictor {
        let thresholds = settings
            .costs
            .thresholds()
            .expect("costs are validated with the settings");
        let service = settings.url.as_ref().map(|u| {
            let uri: Uri = u.as_str().parse().expect("a validated URL is a URI");
            let host = HeaderValue::from_str(uri.authority().map_or("", |a| a.as_str()))
                .expect("a URI authority is a header value");
            Service {
                // Its own client: the predictor is the operator's service
                // (often beside tessera on loopback), not an upstream, as
                // the external authorizer is.
                client: crate::upstream::client_with_roots(
                    connect_timeout,
                    Duration::from_secs(90),
                    crate::upstream::egress::Egress {
                        allow_private: true,
                    },
                    roots,
                ),
                uri,
                host,
            }
        });
        Predictor {
            loaded: tokio::sync::Mutex::new(Loaded {
                model: model::Model::new(settings.half_life),
                last: 0,
                generation: None,
            }),
            thresholds,
            settings,
            store,
            service,
            in_flight: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub fn thresholds(&self) -> Thresholds {
        self.thresholds
    }

    /// Whether the operator's predictor replaces the built-in model.
    pub fn external(&self) -> bool {
        self.service.is_some()
    }

    /// Predictions under way (a task each), for tests and operators.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Predict `q`, in a task of its own, within `--predict-timeout-ms`.
    /// At the deadline the task is aborted (its exchange with a predictor
    /// dropped, which closes that connection) and the outcome is
    /// [`Outcome::Failed`]; so is any error or panic.
    pub async fn predict(self: &Arc<Self>, q: Question, now_ms: i64) -> Outcome {
        struct Counted(Arc<AtomicUsize>);
        impl Drop for Counted {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let counted = Counted(self.in_flight.clone());
        let me = self.clone();
        let mut task = tokio::spawn(async move {
            let _counted = counted;
            me.run(&q, now_ms).await
        });
        match tokio::time::timeout(self.settings.timeout, &mut task).await {
            Ok(Ok(Ok(outcome))) => outcome,
            Ok(Ok(Err(why))) => Outcome::Failed(why),
            Ok(Err(e)) => {
                tracing::error!(error = %e, "a prediction task failed");
                Outcome::Failed("the prediction failed".into())
            }
            Err(_) => {
                task.abort();
                Outcome::Failed(format!(
                    "no prediction within {} ms",
                    self.settings.timeout.as_millis()
                ))
            }
        }
    }

    async fn run(&self, q: &Question, now_ms: i64) -> Result<Outcome, String> {
        match &self.service {
            Some(s) => self.ask_service(s, q).await,
            None => {
                let loaded = self.up_to_date().await?;
                Ok(Outcome::Model(loaded.model.predict(
                    &q.subject(),
                    &self.thresholds,
                    now_ms,
                )))
            }
        }
    }

    /// The model with every answer the store holds folded in: the new ones
    /// since the last read, or all of them again when evidence was
    /// forgotten meanwhile. Held calls pay for this read; nothing else
    /// does. The store is read without the model's lock (which is held
    /// only to fold rows in), so one slow read delays no other prediction
    /// (found by the attack review).
    async fn up_to_date(&self) -> Result<tokio::sync::MutexGuard<'_, Loaded>, String> {
        let db = |e: crate::store::StoreError| format!("reading the evidence: {e}");
        let generation = self.store.evidence_generation().await.map_err(db)?;
        let after = {
            let l = self.loaded.lock().await;
            if l.generation == Some(generation) {
                l.last
            } else {
                0
            }
        };
        let rows = self.store.evidence_after(after).await.map_err(db)?;
        let mut l = self.loaded.lock().await;
        // Generations only grow. A model already at a later one is fresher
        // than these rows (some of them may be forgotten): it stands.
        if l.generation.is_some_and(|g| g > generation) {
            return Ok(l);
        }
        if l.generation != Some(generation) {
            // Read from the first row (the generation differed when looked
            // at, and a model can only have moved on since): rebuilt whole.
            debug_assert_eq!(after, 0);
            l.model = model::Model::new(self.settings.half_life);
            l.last = 0;
            l.generation = Some(generation);
        }
        let last = l.last;
        for r in rows.iter().filter(|r| r.id > last) {
            l.model.add(&model::Answer {
                at: r.at,
                caller: r.caller.clone(),
                credential: r.credential.clone(),
                tool: r.tool.clone(),
                shape: r.shape.clone(),
                granted: r.granted,
            });
            l.last = r.id;
        }
        Ok(l)
    }

    /// What the built-in model makes of each call now, for the console
    /// (read from the store as a prediction would be).
    pub async fn explain(&self, qs: &[Question], now_ms: i64) -> Result<Vec<Prediction>, String> {
        let l = self.up_to_date().await?;
        Ok(qs
            .iter()
            .map(|q| l.model.explain(&q.subject(), &self.thresholds, now_ms))
            .collect())
    }

    async fn ask_service(&self, s: &Service, q: &Question) -> Result<Outcome, String> {
        let body = serde_json::to_vec(q).map_err(|e| e.to_string())?;
        let mut r = Request::new(Bytes::from(body));
        *r.method_mut() = Method::POST;
        *r.uri_mut() = s.uri.clone();
        let h = r.headers_mut();
        h.insert(header::HOST, s.host.clone());
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        use crate::upstream::pool::{ExchangeError, SendError};
        let answer = s
            .client
            .exchange(r, "predictor", MAX_ANSWER_BYTES)
            .await
            .map_err(|e| match e {
                ExchangeError::Send(SendError::Connect(e)) => {
                    format!("could not connect to the predictor: {e}")
                }
                ExchangeError::Send(SendError::Http(e)) => {
                    format!("broken HTTP exchange with the predictor: {e}")
                }
                e @ ExchangeError::Body(_) => format!("reading the predictor's answer: {e}"),
            })?;
        if !answer.status.is_success() {
            return Err(format!(
                "the predictor answered HTTP {}",
                answer.status.as_u16()
            ));
        }
        let (p, reason) = read_answer(&answer.body)?;
        let t = &self.thresholds;
        let action = if p > t.allow {
            Action::Allow
        } else if p < t.deny {
            Action::Deny
        } else {
            Action::Ask
        };
        Ok(Outcome::Service {
            action,
            p,
            reason,
            thresholds: *t,
        })
    }
}

/// What the built-in model makes of `q` at `now_ms` from every answer the
/// store holds, with `settings`' costs and half-life: for `tessera approval
/// explain`, outside a serving process.
pub async fn explain(
    store: &Store,
    settings: &Settings,
    q: &Question,
    now_ms: i64,
) -> Result<Prediction, crate::store::StoreError> {
    let thresholds = settings
        .costs
        .thresholds()
        .expect("costs are validated with the settings");
    let mut m = model::Model::new(settings.half_life);
    for r in store.evidence_after(0).await? {
        m.add(&model::Answer {
            at: r.at,
            caller: r.caller,
            credential: r.credential,
            tool: r.tool,
            shape: r.shape,
            granted: r.granted,
        });
    }
    Ok(m.explain(&q.subject(), &thresholds, now_ms))
}

/// A predictor's answer: `{"p": 0.97, "reason": "…"}` with `p` a number
/// in [0, 1]; anything else is an error (which asks).
fn read_answer(body: &[u8]) -> Result<(f64, Option<String>), String> {
    #[derive(serde::Deserialize)]
    struct Answer {
        p: f64,
        #[serde(default)]
        reason: Option<String>,
    }
    let a: Answer = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .filter(serde_json::Value::is_object)
        .and_then(|v| serde_json::from_value(v).ok())
        .ok_or("the predictor's answer is not {\"p\": <number>, \"reason\": \"...\"}")?;
    if !(0.0..=1.0).contains(&a.p) {
        return Err(format!("the predictor's p {} is outside [0, 1]", a.p));
    }
    let reason = a.reason.map(|r| {
        crate::telemetry::log::printable(&r.chars().take(MAX_REASON_CHARS).collect::<String>())
            .into_owned()
    });
    Ok((a.p, reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_predictors_answer_is_read_strictly() {
        assert_eq!(
            read_answer(br#"{"p":0.97,"reason":"ok"}"#),
            Ok((0.97, Some("ok".into())))
        );
        assert_eq!(read_answer(br#"{"p":0}"#), Ok((0.0, None)));
        for bad in [
            &br#"{"p":1.5}"#[..],
            br#"{"p":-0.1}"#,
            br#"{"p":"0.9"}"#,
            br#"[0.9]"#,
            br#"{"reason":"no p"}"#,
            b"garbage",
            b"",
        ] {
            assert!(
                read_answer(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    fn question() -> Question {
        Question {
            caller: "agent".into(),
            connection: "c".into(),
            credential: "gh".into(),
            tool: "run_tests".into(),
            rpc_method: "tools/call".into(),
            shape: "{suite:string}".into(),
            arguments: None,
        }
    }

    async fn predictor(settings: Settings) -> (Arc<Predictor>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_data_dir(dir.path()).await.unwrap();
        let roots = rustls::RootCertStore::empty();
        (
            Arc::new(Predictor::new(
                settings,
                store,
                Duration::from_secs(1),
                roots,
            )),
            dir,
        )
    }

    /// A predictor that accepts and reads, and answers `answer` (or never).
    async fn service(
        answer: Option<&'static str>,
    ) -> (url::Url, tokio::sync::oneshot::Receiver<()>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = url::Url::parse(&format!("http://{}/predict", l.local_addr().unwrap())).unwrap();
        let (closed, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let _ = s.read(&mut buf).await;
            if let Some(a) = answer {
                let _ = s.write_all(a.as_bytes()).await;
            }
            // Wait for the other side to close (EOF), bounded.
            let _ = tokio::time::timeout(Duration::from_secs(10), async {
                while s.read(&mut buf).await.is_ok_and(|n| n > 0) {}
            })
            .await;
            let _ = closed.send(());
        });
        (url, rx)
    }

    fn http(body: &str, status: &str) -> &'static str {
        Box::leak(
            format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            )
            .into_boxed_str(),
        )
    }

    #[tokio::test]
    async fn every_failure_asks_and_nothing_fails_open() {
        for (answer, why) in [
            (Some(http("garbage", "200 OK")), "is not"),
            (Some(http(r#"{"p":1.5}"#, "200 OK")), "outside"),
            (
                Some(http(r#"{"p":0.999}"#, "500 Internal Server Error")),
                "HTTP 500",
            ),
            (Some("not http at all\r\n\r\n"), "broken HTTP"),
            (None, "no prediction within"),
        ] {
            let (url, _closed) = service(answer).await;
            let (p, _dir) = predictor(Settings {
                url: Some(url),
                timeout: Duration::from_millis(300),
                ..Settings::default()
            })
            .await;
            let o = p.predict(question(), 0).await;
            assert_eq!(o.action(), Action::Ask, "{o:?}");
            match &o {
                Outcome::Failed(r) => assert!(r.contains(why), "{r} / {why}"),
                other => panic!("{other:?}"),
            }
            assert!(o.reason(&question()).starts_with("prediction failed"));
        }
        // Nobody listening.
        let (p, _dir) = predictor(Settings {
            url: Some(url::Url::parse("http://127.0.0.1:9/").unwrap()),
            ..Settings::default()
        })
        .await;
        assert_eq!(p.predict(question(), 0).await.action(), Action::Ask);
    }

    #[tokio::test]
    async fn a_hanging_predictor_is_dropped_at_the_deadline() {
        let (url, closed) = service(None).await;
        let (p, _dir) = predictor(Settings {
            url: Some(url),
            timeout: Duration::from_millis(100),
            ..Settings::default()
        })
        .await;
        let o = p.predict(question(), 0).await;
        assert!(matches!(o, Outcome::Failed(_)), "{o:?}");
        // The exchange was dropped: its connection closes, and no task is
        // left counting.
        tokio::time::timeout(Duration::from_secs(10), closed)
            .await
            .expect("the predictor's connection was left open")
            .unwrap();
        let left = async {
            while p.in_flight() > 0 {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), left)
            .await
            .expect("a prediction task was left behind");
    }

    #[tokio::test]
    async fn a_service_decides_by_the_thresholds() {
        for (p_text, action) in [
            ("0.995", Action::Allow),
            ("0.5", Action::Ask),
            ("0.1", Action::Deny),
        ] {
            let body: &'static str =
                Box::leak(format!(r#"{{"p":{p_text},"reason":"seen before"}}"#).into_boxed_str());
            let (url, _closed) = service(Some(http(body, "200 OK"))).await;
            let (p, _dir) = predictor(Settings {
                url: Some(url),
                timeout: Duration::from_secs(5),
                ..Settings::default()
            })
            .await;
            let o = p.predict(question(), 0).await;
            assert_eq!(o.action(), action, "{o:?}");
            assert!(o.reason(&question()).contains("by the predictor"), "{o:?}");
        }
    }

    #[tokio::test]
    async fn with_no_evidence_the_built_in_model_asks() {
        let (p, _dir) = predictor(Settings::default()).await;
        let o = p.predict(question(), 0).await;
        assert_eq!(
            o,
            Outcome::Model(model::decide(
                model::Model::new(Duration::from_secs(1)).evidence(&question().subject(), 0),
                &p.thresholds()
            ))
        );
        assert_eq!(o.action(), Action::Ask);
        assert!(o
            .reason(&question())
            .starts_with("no level has 3 answers yet: a person decides"));
    }
}
