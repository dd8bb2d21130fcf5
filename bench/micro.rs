//! Micro-benchmarks of the per-request pieces of the data plane, each on
//! realistic input: the caller-token check, header strip/inject and
//! response filtering, the JSON-RPC peek of method and tool name, and
//! address routing, and one policy decision (Cedar, default and example
//! policies). Target: each under 1 µs on the benchmark machine. Also the
//! decoding of a body an upstream compressed anyway (rare: tessera asks
//! for `identity`), to show its cost per frame.
//!
//! `cargo bench --bench micro` (add `-- --quick` for a short run).

use std::sync::Arc;

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion};
use futures_util::FutureExt;
use http::{HeaderMap, HeaderValue, Method};
use http_body_util::BodyExt;
use tessera::authz::cedar::Policies;
use tessera::authz::AuthzRequest;
use tessera::credentials::injection;
use tessera::crypto::keyring::SecretString;
use tessera::crypto::tokens::token_digest;
use tessera::model::{Caller, Connection, Upstream};
use tessera::proxy::authn::{authenticate, connection_for};
use tessera::proxy::forward::strip_and_inject;
use tessera::proxy::jsonrpc::peek;
use tessera::proxy::response::headers::filter_response_headers;
use tessera::proxy::route::route;
use tessera::snapshot::Snapshot;
use tessera::store::model::Scheme;
use tessera::wire::decode::{decode_body, Coding};

const TOKEN: &str = "tsr_Jq0Xb7c2Vt9mW1pZr4sN8kL3hG6fD5aE0yU2iO7wQ1";
const CONN: &str = "3q2xN8kLmP0vR5tY7wZ1aB4cD6eF9gH2";
/// A realistic `tools/call` body: a tool with a few arguments.
const TOOLS_CALL: &[u8] = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"update_issue","arguments":{"owner":"acme","repo":"widgets","issue_number":42,"labels":["bug","triage"],"body":"Steps to reproduce:\n1. open the app\n2. click save\nExpected: saved. Actual: error 500."},"_meta":{"progressToken":"p-7","io.modelcontextprotocol/protocolVersion":"2025-11-25"}}}"#;

/// A snapshot with 1,000 callers and one connection each, like a sidecar
/// serving many sandboxes.
fn snapshot() -> Snapshot {
    let up = Arc::new(Upstream {
        credential: "github".into(),
        url: "http://127.0.0.1:18081/mcp".parse().unwrap(),
        auth: tessera::model::Auth::Static(
            injection(
                Scheme::Bearer,
                None,
                None,
                &SecretString::from("ghp_upstreamsecret".to_string()),
            )
            .unwrap(),
        ),
    });
    let mut callers = foldhash::HashMap::default();
    let mut connections = foldhash::HashMap::default();
    for i in 0..1000i64 {
        let (token, id) = if i == 500 {
            (TOKEN.to_string(), CONN.to_string())
        } else {
            (format!("tsr_other_{i:040}"), format!("conn{i:028}"))
        };
        callers.insert(
            token_digest(token.as_bytes()),
            Arc::new(Caller {
                id: i,
                name: format!("agent-{i}"),
                groups: Vec::new(),
                usage: Default::default(),
            }),
        );
        connections.insert(
            id,
            Connection {
                caller_id: i,
                upstream: up.clone(),
            },
        );
    }
    let entities = tessera::authz::cedar::entities(
        callers.values().map(|c| &**c),
        connections.iter().map(|(id, c)| (id.as_str(), c)),
        Policies::builtin().schema(),
    );
    Snapshot {
        revision: 1,
        callers,
        connections,
        entities,
        pins: Default::default(),
    }
}

/// The shipped default policy plus every example in `policies/examples/`.
fn example_policies() -> Policies {
    let dir = tempfile::tempdir().unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    std::fs::copy(root.join("default.cedar"), dir.path().join("default.cedar")).unwrap();
    for e in std::fs::read_dir(root.join("examples")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
    }
    Policies::load_dir(dir.path()).unwrap()
}

/// The headers an MCP client sends on a `tools/call`.
fn request_headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    let v = HeaderValue::from_static;
    h.insert("host", v("127.0.0.1:7470"));
    h.insert(
        "authorization",
        HeaderValue::from_str(&format!("Bearer {TOKEN}")).unwrap(),
    );
    h.insert("content-type", v("application/json"));
    h.insert("accept", v("application/json, text/event-stream"));
    h.insert("content-length", v("321"));
    h.insert("mcp-session-id", v("6f1c2b7e-59a4-4d0f-9c1e-2a7d3b8e4f10"));
    h.insert("mcp-protocol-version", v("2025-11-25"));
    h.insert("user-agent", v("node"));
    h.insert("connection", v("keep-alive"));
    h
}

/// The headers an upstream answers a `tools/call` with.
fn response_headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    let v = HeaderValue::from_static;
    h.insert("content-type", v("application/json"));
    h.insert("content-length", v("140"));
    h.insert("mcp-session-id", v("6f1c2b7e-59a4-4d0f-9c1e-2a7d3b8e4f10"));
    h.insert("set-cookie", v("upstream_session=abc; HttpOnly"));
    h.insert(
        "www-authenticate",
        v("Bearer resource_metadata=\"http://x/\""),
    );
    h.insert("date", v("Thu, 03 Dec 2026 07:00:00 GMT"));
    h
}

/// A `tools/list`-like JSON answer of exactly 4 KiB, gzip-compressed.
fn gzip_json_body() -> bytes::Bytes {
    use std::io::Write;
    let mut json = String::from(r#"{"jsonrpc":"2.0","id":3,"result":{"tools":["#);
    for i in 0.. {
        let tool = format!(
            r#"{{"name":"tool_{i}","description":"Does thing {i} to a repository","inputSchema":{{"type":"object","properties":{{"owner":{{"type":"string"}},"repo":{{"type":"string"}}}}}}}}"#
        );
        if json.len() + tool.len() + 5 > 4096 {
            break;
        }
        if i > 0 {
            json.push(',');
        }
        json.push_str(&tool);
    }
    json.push_str("]}}");
    // Whitespace to exactly 4 KiB, still valid JSON.
    while json.len() < 4096 {
        json.push(' ');
    }
    assert_eq!(json.len(), 4096);
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(json.as_bytes()).unwrap();
    e.finish().unwrap().into()
}

fn benches(c: &mut Criterion) {
    let snap = snapshot();
    let req = request_headers();
    let inj = injection(
        Scheme::Bearer,
        None,
        None,
        &SecretString::from("ghp_upstreamsecret".to_string()),
    )
    .unwrap();

    c.bench_function(
        "authenticate (bearer parse + SHA-256 + lookup, 1k callers)",
        |b| b.iter(|| authenticate(black_box(&snap), black_box(&req)).unwrap()),
    );
    let caller = authenticate(&snap, &req).unwrap();
    c.bench_function("route + connection lookup", |b| {
        let path = format!("/c/{CONN}");
        b.iter(|| {
            let r = route(black_box(&Method::POST), black_box(&path)).unwrap();
            connection_for(&snap, &caller, r.connection_id).unwrap();
        })
    });
    c.bench_function("jsonrpc peek (tools/call, 330 B)", |b| {
        b.iter(|| {
            let p = peek(black_box(TOOLS_CALL)).unwrap();
            black_box(p.messages()[0].tool().is_some());
        })
    });
    c.bench_function("strip + inject request headers", |b| {
        b.iter_batched_ref(
            || req.clone(),
            |h| strip_and_inject(h, &inj, false),
            BatchSize::SmallInput,
        )
    });
    let conn = &snap.connections[CONN];
    let body = peek(TOOLS_CALL).unwrap();
    let m = &body.messages()[0];
    let ask = AuthzRequest {
        caller: &caller,
        connection_id: CONN,
        connection: conn,
        entities: &snap.entities,
        revision: snap.revision,
        http_method: &Method::POST,
        path: "",
        rpc_method: m.method.as_deref(),
        tool: m.tool(),
        arguments: m.arguments(),
        protocol_version: Some("2025-11-25"),
        origin: None,
        time: std::time::SystemTime::now(),
    };
    for (name, policies) in [
        ("policy decision (default policy)", Policies::builtin()),
        (
            "policy decision (default + 5 example policies)",
            example_policies(),
        ),
    ] {
        assert!(policies.evaluate(&ask).allowed || name.contains("example"));
        // Decided before: the cache's answer, as in steady state.
        c.bench_function(name, |b| b.iter(|| policies.evaluate(black_box(&ask))));
        // The first decision for a caller, connection, action and context.
        c.bench_function(&format!("{name}, uncached"), |b| {
            b.iter(|| policies.evaluate_uncached(black_box(&ask)))
        });
    }
    c.bench_function("audit arguments digest (SHA-256 as sent)", |b| {
        b.iter(|| tessera::crypto::tokens::sha256_hex(black_box(m.arguments().unwrap().as_bytes())))
    });
    // Part of every peek above: the arguments walked for names equal
    // ignoring letter case (issue 23).
    c.bench_function("arguments: member-name check (every tools/call)", |b| {
        b.iter(|| tessera::authz::canonical::check(black_box(m.arguments().unwrap())))
    });
    // What a policy set that reads `context.arguments` adds per decision.
    c.bench_function(
        "arguments: canonical JSON text (sets that read arguments)",
        |b| b.iter(|| tessera::authz::canonical::canonical(black_box(m.arguments().unwrap()))),
    );
    c.bench_function(
        "approval key (params read again, canonical JSON + SHA-256; held calls only)",
        |b| {
            b.iter(|| {
                let params = tessera::authz::approvals::params_of(black_box(TOOLS_CALL)).unwrap();
                tessera::authz::approvals::call_digest(&tessera::authz::approvals::Call {
                    sub_path: "",
                    query: None,
                    params: params[0],
                    session: &[b"3f1c9e"],
                })
            })
        },
    );
    let redactor = inj.redactor.clone();
    let frame = bytes::Bytes::from_static(br#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"Issue #42 updated: labels bug, triage. Body saved (212 bytes)."}],"isError":false}}"#);
    c.bench_function("redact: scan a 160-byte response frame", |b| {
        b.iter(|| black_box(&redactor).found_in(black_box(&frame)))
    });
    // A tool result of 4 KiB whose text is full of JSON escapes (a file's
    // lines): the escape levels work on every `\n`.
    let text = r"line of a file with \n escapes, 50% of them \u00e9 and &amp; more\n".repeat(64);
    let escaped = bytes::Bytes::from(format!(
        r#"{{"jsonrpc":"2.0","id":7,"result":{{"content":[{{"type":"text","text":"{text}"}}]}}}}"#
    ));
    c.bench_function("redact: scan a 4 KiB frame full of escapes", |b| {
        b.iter(|| black_box(&redactor).found_in(black_box(&escaped)))
    });
    let mut headers = response_headers();
    c.bench_function("redact: response headers", |b| {
        b.iter(|| black_box(&redactor).headers(black_box(&mut headers)))
    });
    let gz = gzip_json_body();
    c.bench_function("decode: a 4 KiB gzip JSON body (one frame)", |b| {
        b.iter(|| {
            let body = http_body_util::Full::new(black_box(gz.clone()));
            let mut d = decode_body(vec![Coding::Gzip], body);
            let mut n = 0;
            while let Some(f) = d.frame().now_or_never().expect("always ready") {
                n += f.unwrap().into_data().unwrap().len();
            }
            assert_eq!(n, 4096);
        })
    });
    let resp = response_headers();
    c.bench_function("filter response headers", |b| {
        b.iter_batched_ref(
            || resp.clone(),
            filter_response_headers,
            BatchSize::SmallInput,
        )
    });
}

/// Writing audit records: one batch of 512 (what the writer does under
/// load), on a real SQLite database in a temporary data dir.
fn audit_batch(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = rt
        .block_on(tessera::store::Store::open_data_dir(dir.path()))
        .unwrap();
    let rows: Vec<_> = (0..512)
        .map(|i| tessera::store::model::AuditRecord {
            id: 0,
            at: 1_796_300_000_000 + i,
            caller: format!("agent-{}", i % 16),
            connection: CONN.to_string(),
            http_method: "POST".into(),
            rpc_method: Some("tools/call".into()),
            tool: Some("update_issue".into()),
            verdict: "allow".into(),
            reason: Some("own-connections".into()),
            arguments_sha256: Some("ab".repeat(32)),
            arguments: None,
            status: 200,
            duration_us: 180,
            request_id: Some(format!("{i:032x}")),
        })
        .collect();
    // One sink, as the audit writer keeps one (on SQLite its thread and
    // its prepared statements).
    let sink = store.audit_sink().unwrap();
    let mut g = c.benchmark_group("audit");
    g.throughput(criterion::Throughput::Elements(rows.len() as u64));
    g.bench_function("insert a batch of 512 records (SQLite)", |b| {
        let mut batch = rows.clone();
        b.iter(|| rt.block_on(sink.write(black_box(&mut batch))).unwrap())
    });
    g.finish();
    // The CPU the writer costs, not the wall time (which waits for the
    // disk's fsync): the whole process's CPU clock, so the writer's own
    // thread counts. Per batch size: the writer's 512, and one statement's
    // chunk (64, the longest a statement holds a core).
    let mut g = c.benchmark_group("audit CPU");
    for n in [64, 512] {
        let mut batch = rows[..n].to_vec();
        g.throughput(criterion::Throughput::Elements(n as u64));
        g.bench_function(format!("insert a batch of {n} records (SQLite)"), |b| {
            b.iter_custom(|iters| {
                let start = process_cpu();
                for _ in 0..iters {
                    rt.block_on(sink.write(black_box(&mut batch))).unwrap();
                }
                process_cpu() - start
            })
        });
    }
    // Of which the proxy's runtime pays: this thread's CPU clock (the
    // benchmark's runtime is a current-thread one, as in serve's
    // `--worker-threads 1`): handing the batch over and waking for the
    // answer.
    let mut batch = rows.clone();
    g.bench_function(
        "the runtime's thread: a batch of 512 records (SQLite)",
        |b| {
            b.iter_custom(|iters| {
                let start = thread_cpu();
                for _ in 0..iters {
                    rt.block_on(sink.write(black_box(&mut batch))).unwrap();
                }
                thread_cpu() - start
            })
        },
    );
    g.finish();
}

/// The CPU time of the calling thread.
fn thread_cpu() -> std::time::Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    std::time::Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// The CPU time of this whole process, every thread.
fn process_cpu() -> std::time::Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    std::time::Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// One prediction of a person's answer (approvals that learn) from the
/// in-memory model: 1,000 callers × 20 tools × 3 shapes of answers, each
/// key with a dozen. Held calls alone pay it. Target: ≤ 2 µs. Also the
/// argument shape of the realistic `tools/call` above.
fn prediction(c: &mut Criterion) {
    use tessera::authz::predict::model::{shape, Answer, Model, Subject};
    let mut m = Model::new(std::time::Duration::from_secs(30 * 86_400));
    let shapes = [
        "{suite:string}",
        "{suite:string,verbose:boolean}",
        "{path:string}",
    ];
    let mut at = 1_796_300_000_000;
    for caller in 0..1_000 {
        for tool in 0..20 {
            for s in shapes {
                for n in 0..12 {
                    at += 1;
                    m.add(&Answer {
                        at,
                        caller: format!("agent-{caller}"),
                        credential: Some("gh".into()),
                        tool: format!("run_tool_{tool}"),
                        shape: Some(s.into()),
                        granted: n != 5,
                    });
                }
            }
        }
    }
    let t = tessera::authz::predict::Costs::default()
        .thresholds()
        .unwrap();
    let s = Subject {
        caller: "agent-417",
        credential: "gh",
        tool: "run_tool_7",
        shape: "{suite:string,verbose:boolean}",
    };
    c.bench_function(
        "predict: one held call (in-memory model, 60,000 keys)",
        |b| b.iter(|| m.predict(black_box(&s), &t, at + 1_000)),
    );
    let args = std::str::from_utf8(TOOLS_CALL).unwrap();
    let args = &args[args.find("\"arguments\":").unwrap() + 12..args.find(",\"_meta\"").unwrap()];
    c.bench_function("predict: the argument shape of a tools/call", |b| {
        b.iter(|| shape(Some(black_box(args))))
    });
}

criterion_group!(micro, benches, audit_batch, prediction);
criterion_main!(micro);
