//! What tessera authorizes is what the upstream runs (issue 23, §1): a
//! message some upstream could read otherwise (names equal ignoring letter
//! case, a method in another case, routing headers saying another call)
//! is refused and never forwarded; policies read tool names exactly or
//! folded (`context.tool_folded`) and arguments as the upstream decodes
//! them. The differential peer is real: a Go `encoding/json` upstream
//! (tests/it/go/upstream.go), when a Go toolchain is installed.

use crate::support::*;

/// The shipped default, the tool deny-list example (forbids `delete*`,
/// `drop*` … on `context.tool`), and `extra` policy texts.
fn policies(extra: &[&str]) -> tessera::authz::cedar::Policies {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    let mut files = vec![
        ("default.cedar".to_string(), read("default.cedar")),
        (
            "tool-deny-list.cedar".to_string(),
            read("examples/tool-deny-list.cedar"),
        ),
    ];
    for (i, t) in extra.iter().enumerate() {
        files.push((format!("extra{i}.cedar"), t.to_string()));
    }
    tessera::authz::cedar::Policies::from_texts("test", None, files).unwrap()
}

/// POST `body` as the agent with extra headers; the status and the answer.
async fn post_with(a: &Agent, body: &str, headers: &[(&str, &str)]) -> (u16, serde_json::Value) {
    let mut r = client()
        .post(&a.url)
        .bearer_auth(&a.token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let r = r.body(body.to_string()).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

/// Assert a 400 Invalid Request whose message names `rule`.
fn assert_refused(status: u16, v: &serde_json::Value, rule: &str, what: &str) {
    assert_eq!(status, 400, "{what}: {v}");
    assert_eq!(v["error"]["code"], -32600, "{what}: {v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains(rule), "{what}: {msg}");
}

/// Messages with members an upstream could read otherwise, each a way a
/// Go `encoding/json` upstream ran a tool the policies denied.
pub const AMBIGUOUS: [(&str, &str); 12] = [
    (
        "Name beside name",
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_files","Name":"delete_repo"}}"#,
    ),
    (
        "METHOD and PARAMS beside an innocent method",
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","METHOD":"tools/call","PARAMS":{"name":"delete_repo"}}"#,
    ),
    (
        "paramſ (long s) beside params",
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search"},"paramſ":{"name":"delete_repo"}}"#,
    ),
    (
        "paramſ escaped",
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search"},"param\u017f":{"name":"delete_repo"}}"#,
    ),
    (
        "PARAMS alone, no params",
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","PARAMS":{"name":"delete_repo"}}"#,
    ),
    (
        "Kelvin sign in an argument name",
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"notes.txt","kind":"read","\u212aind":"delete"}}}"#,
    ),
    (
        "the same name twice in params",
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search","name":"delete_repo"}}"#,
    ),
    (
        "the same method twice",
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call","params":{"name":"delete_repo"}}"#,
    ),
    (
        "a duplicate deep in the arguments",
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","arguments":{"opts":[{"path":"notes.txt","PATH":"/etc/passwd"}]}}}"#,
    ),
    (
        "names equal ignoring case in _meta",
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/PROTOCOLVERSION":"2025-03-26"}}}"#,
    ),
    (
        "an unpaired surrogate in the arguments",
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"a\ud800"}}}"#,
    ),
    (
        "a batch with one ambiguous message",
        r#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"search","NAME":"delete_repo"}}]"#,
    ),
];

#[tokio::test]
async fn messages_with_names_equal_ignoring_case_never_reach_the_upstream() {
    let up = Upstream::start().await;
    let p = Proxy::start_with_policies(Proxy::dir(), |_| {}, policies(&[])).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    for (what, body) in AMBIGUOUS {
        let (s, v) = post_with(&a, body, &[]).await;
        assert_refused(s, &v, "ambiguous message", what);
    }
    assert!(up.seen().is_empty(), "an ambiguous message was forwarded");
    // The plain forms pass, byte for byte: the same names in sibling
    // objects, escapes, `_meta`, and distinct names that only look alike.
    let plain = [
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search","arguments":{"a":{"x":1},"b":[{"x":2},{"x":3}],"q":"\u00e9\/"}}}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","progressToken":1}}}"#,
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"search","arguments":{"name":"n","names":"m","ß":1,"ss":2}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    ];
    for body in plain {
        let (s, v) = post_with(&a, body, &[]).await;
        assert!(s == 200 || s == 202, "{body}: {s} {v}");
    }
    let seen = up.seen();
    assert_eq!(seen.len(), plain.len());
    for (s, body) in seen.iter().zip(plain) {
        assert_eq!(s.body, body.as_bytes(), "forwarded byte for byte");
    }
}

#[tokio::test]
async fn methods_in_another_letter_case_are_refused() {
    let up = Upstream::start().await;
    let p = Proxy::start_with_policies(Proxy::dir(), |_| {}, policies(&[])).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let call = |method: &str, tool: &str| {
        serde_json::json!({"jsonrpc":"2.0","id":5,"method":method,"params":{"name":tool,"arguments":{}}})
            .to_string()
    };
    for body in [
        // A tool the deny-list forbids, under a method it would not see.
        call("Tools/call", "delete_repo"),
        // An allowed tool: still not `other` (allowed by default).
        call("TOOLS/CALL", "search"),
        call("tools/Call", "search"),
        call("toolſ/call", "search"),
        // Padded: an upstream that trims the name runs it.
        call("tools/call ", "delete_repo"),
        call("\ttools/call", "delete_repo"),
        r#"{"jsonrpc":"2.0","id":6,"method":"TOOLS/LIST"}"#.to_string(),
        r#"{"jsonrpc":"2.0","method":"Notifications/initialized"}"#.to_string(),
    ] {
        let (s, v) = post_with(&a, &body, &[]).await;
        assert_refused(s, &v, "letter case", &body);
    }
    assert!(
        up.seen().is_empty(),
        "a method in another case was forwarded"
    );
    // Exactly spelled, the deny-list decides: refused as a tool result.
    let (s, v) = post_with(&a, &call("tools/call", "delete_repo"), &[]).await;
    assert_eq!((s, &v["result"]["isError"]), (200, &true.into()), "{v}");
    assert!(up.seen().is_empty());
}

#[tokio::test]
async fn policies_can_compare_tool_names_ignoring_case() {
    let up = Upstream::start().await;
    let folded = r#"@id("no-deletes-any-case")
forbid (principal, action == Action::"tools/call", resource)
when { context has tool_folded && context.tool_folded like "delete*" };"#;
    let p = Proxy::start_with_policies(Proxy::dir(), |_| {}, policies(&[folded])).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    for tool in ["Delete_repo", "DELETE_REPO", "delete_repo"] {
        let (s, v) = post_with(&a, &tools_call(1, tool), &[]).await;
        assert_eq!(
            (s, &v["result"]["isError"]),
            (200, &true.into()),
            "{tool}: {v}"
        );
        let text = v["result"]["content"][0]["text"].as_str().unwrap();
        assert!(
            text.contains("no-deletes-any-case") || tool == "delete_repo",
            "{text}"
        );
    }
    assert!(up.seen().is_empty(), "a folded delete reached the upstream");
    let (s, v) = post_with(&a, &tools_call(2, "Search"), &[]).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(up.seen().len(), 1);
}

#[tokio::test]
async fn policies_read_the_arguments_as_the_upstream_decodes_them() {
    let up = Upstream::start().await;
    let etc = r#"@id("no-etc")
forbid (principal, action == Action::"tools/call", resource)
when { context has arguments && context.arguments like "*\"path\":\"/etc/*" };"#;
    let p = Proxy::start_with_policies(Proxy::dir(), |_| {}, policies(&[etc])).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let call = |args: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"read_file","arguments":{args}}}}}"#
        )
    };
    for args in [
        r#"{"path":"/etc/passwd"}"#,
        r#"{"path":"\/etc\/passwd"}"#,
        r#"{"path":"\u002fetc/passwd"}"#,
        r#"{"path":"\u002F\u0065tc\u002Fpasswd"}"#,
        r#"{ "path" : "/etc/passwd" }"#,
        r#"{"z":1,"path":"/etc/shadow","a":[1,2]}"#,
    ] {
        let (s, v) = post_with(&a, &call(args), &[]).await;
        assert_eq!(
            (s, &v["result"]["isError"]),
            (200, &true.into()),
            "{args}: {v}"
        );
        let text = v["result"]["content"][0]["text"].as_str().unwrap();
        assert!(text.contains("no-etc"), "{args}: {text}");
    }
    assert!(
        up.seen().is_empty(),
        "a path under /etc reached the upstream"
    );
    let (s, v) = post_with(&a, &call(r#"{"path":"notes\/etc.txt"}"#), &[]).await;
    assert_eq!(s, 200, "{v}");
    assert!(v["result"]["isError"].is_null(), "{v}");
    assert_eq!(up.seen().len(), 1);
}

/// Extra request headers, by name and value.
type Headers<'a> = &'a [(&'a str, &'a str)];

#[tokio::test]
async fn routing_headers_must_say_what_the_body_says() {
    let up = Upstream::start().await;
    let p = Proxy::start_with_policies(Proxy::dir(), |_| {}, policies(&[])).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let search = tools_call(1, "search");
    let read = r#"{"jsonrpc":"2.0","id":2,"method":"resources/read","params":{"uri":"file:///notes.txt"}}"#;
    let list = r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#;
    let batch = format!("[{list},{search}]");
    let refused: [(&str, &str, Headers); 8] = [
        (
            "Mcp-Name of a denied tool",
            &search,
            &[("mcp-method", "tools/call"), ("mcp-name", "delete_repo")],
        ),
        (
            "Mcp-Method of another method",
            &search,
            &[("mcp-method", "tools/list")],
        ),
        (
            "Mcp-Method in another letter case",
            &search,
            &[("mcp-method", "Tools/call")],
        ),
        (
            "Mcp-Name twice",
            &search,
            &[("mcp-name", "search"), ("mcp-name", "search")],
        ),
        (
            "Mcp-Method twice",
            &search,
            &[("mcp-method", "tools/call"), ("mcp-method", "tools/call")],
        ),
        (
            "Mcp-Name on a method that names nothing",
            list,
            &[("mcp-name", "search")],
        ),
        (
            "Mcp-Name of another resource",
            read,
            &[("mcp-name", "file:///etc/passwd")],
        ),
        (
            "Mcp-Method on a batch",
            &batch,
            &[("mcp-method", "tools/list")],
        ),
    ];
    for (what, body, headers) in refused {
        let (s, v) = post_with(&a, body, headers).await;
        assert_refused(s, &v, "header mismatch", what);
    }
    // A bodiless GET has no method to agree with.
    let r = client()
        .get(&a.url)
        .bearer_auth(&a.token)
        .header("mcp-method", "tools/call")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(up.seen().is_empty(), "a mismatched request was forwarded");

    // Agreeing headers pass, and reach the upstream.
    let b64 = "=?base64?ZmlsZTovLy9ub3Rlcy50eHQ=?=";
    let agreeing: [(&str, Headers); 4] = [
        (
            &search,
            &[("mcp-method", "tools/call"), ("mcp-name", "search")],
        ),
        (
            read,
            &[
                ("mcp-method", "resources/read"),
                ("mcp-name", "file:///notes.txt"),
            ],
        ),
        (read, &[("mcp-method", "resources/read"), ("mcp-name", b64)]),
        (list, &[("mcp-method", "tools/list")]),
    ];
    for (body, headers) in agreeing {
        let (s, v) = post_with(&a, body, headers).await;
        assert_eq!(s, 200, "{body} {headers:?}: {v}");
    }
    let seen = up.seen();
    assert_eq!(seen.len(), agreeing.len());
    assert_eq!(seen[0].headers["mcp-name"], "search");
}

/// tessera's own answers are valid for the caller's revision: a refused
/// or held `tools/call` from a 2026-07-28 caller (by its header or its
/// `_meta`) is a result with `resultType`, which its SDK requires; older
/// revisions get none.
#[tokio::test]
async fn refusals_and_holds_carry_result_type_for_the_stateless_revision() {
    let up = Upstream::start().await;
    let ask = r#"@id("ask-writes") @ask
permit (principal, action == Action::"tools/call", resource)
when { context has tool && context.tool == "write_file" };"#;
    let p = Proxy::start_with_policies(Proxy::dir(), |_| {}, policies(&[ask])).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let modern = |tool: &str| {
        serde_json::json!({"jsonrpc":"2.0","id":1,"method":"tools/call",
            "params":{"name":tool,"arguments":{},
            "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}})
        .to_string()
    };
    for tool in ["Delete_repo", "write_file"] {
        for headers in [&[("mcp-protocol-version", "2026-07-28")][..], &[]] {
            let (s, v) = post_with(&a, &modern(tool), headers).await;
            assert_eq!(s, 200, "{v}");
            assert_eq!(v["result"]["isError"], true, "{v}");
            assert_eq!(
                v["result"]["resultType"], "complete",
                "{tool} {headers:?}: {v}"
            );
        }
        let (s, v) = post_with(
            &a,
            &tools_call(1, tool),
            &[("mcp-protocol-version", "2025-11-25")],
        )
        .await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["result"]["isError"], true, "{v}");
        assert!(v["result"].get("resultType").is_none(), "{v}");
    }
    assert!(up.seen().is_empty());
}

/// `Mcp-Param-*` headers mirror a tools/call's arguments; one that says
/// another value than the body (a region, a tenant an intermediary would
/// route on) is refused, and so is `MCP-Protocol-Version` naming another
/// revision than the body's `_meta` (-32020, as the revision says).
#[tokio::test]
async fn param_and_version_headers_must_say_what_the_body_says() {
    let up = Upstream::start().await;
    let p = Proxy::start_with_policies(Proxy::dir(), |_| {}, policies(&[])).await;
    let a = p.agent("gh", &up.url("/mcp"), "agent").await;
    let call = serde_json::json!({"jsonrpc":"2.0","id":1,"method":"tools/call",
        "params":{"name":"search","arguments":{"region":"us-west1","q":" padded ","n":42,"deep":true},
        "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}})
    .to_string();
    let list = r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#;
    let refused: [(&str, &str, Headers); 5] = [
        (
            "a region the body does not name",
            &call,
            &[("mcp-param-region", "eu-west4")],
        ),
        (
            "a number the body does not hold",
            &call,
            &[("mcp-param-n", "43")],
        ),
        (
            "a base64 value the body does not hold",
            &call,
            &[("mcp-param-q", "=?base64?cGFkZGVk?=")],
        ),
        (
            "the header twice",
            &call,
            &[
                ("mcp-param-region", "us-west1"),
                ("mcp-param-region", "us-west1"),
            ],
        ),
        (
            "on a method that is not tools/call",
            list,
            &[("mcp-param-region", "us-west1")],
        ),
    ];
    for (what, body, headers) in refused {
        let (s, v) = post_with(&a, body, headers).await;
        assert_refused(s, &v, "Mcp-Param", what);
    }
    let (s, v) = post_with(&a, &call, &[("mcp-protocol-version", "2025-11-25")]).await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["error"]["code"], -32020, "{v}");
    assert!(up.seen().is_empty(), "a mismatched request was forwarded");

    let agreeing: [Headers; 4] = [
        &[("mcp-param-region", "us-west1"), ("mcp-param-n", "42")],
        &[
            ("mcp-param-q", "=?base64?IHBhZGRlZCA=?="),
            ("mcp-param-deep", "true"),
        ],
        &[("mcp-protocol-version", "2026-07-28")],
        &[],
    ];
    for headers in agreeing {
        let (s, v) = post_with(&a, &call, headers).await;
        assert_eq!(s, 200, "{headers:?}: {v}");
    }
    let seen = up.seen();
    assert_eq!(seen.len(), agreeing.len());
    assert_eq!(seen[0].headers["mcp-param-region"], "us-west1");
}

/// The Go upstream, built from tests/it/go/upstream.go; `None` without a
/// Go toolchain (the Rust upstream tests above prove the refusals; this
/// one shows they are the differential a real Go decoder has).
struct GoUpstream {
    child: std::process::Child,
    addr: String,
}

impl GoUpstream {
    fn start() -> Option<GoUpstream> {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("go-upstream");
        std::fs::create_dir_all(&dir).unwrap();
        let bin = dir.join("upstream");
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/go/upstream.go");
        let built = std::process::Command::new("go")
            .args(["build", "-o"])
            .arg(&bin)
            .arg(src)
            .env("GOCACHE", dir.join("cache"))
            .output();
        match built {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => panic!("running go: {e}"),
            Ok(o) => assert!(
                o.status.success(),
                "go build: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
        }
        let mut child = std::process::Command::new(&bin)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        Some(GoUpstream {
            child,
            addr: line.trim().to_string(),
        })
    }

    async fn ran(&self) -> Vec<serde_json::Value> {
        let r = client()
            .get(format!("http://{}/ran", self.addr))
            .send()
            .await
            .unwrap();
        r.json().await.unwrap()
    }
}

impl Drop for GoUpstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_go_upstream_runs_only_what_was_authorized() {
    let Some(go) = GoUpstream::start() else {
        eprintln!("skipped: no Go toolchain (`go`) to build the encoding/json upstream");
        return;
    };
    // Straight to Go, the hostile forms run the denied tool (or argument):
    // the differential is real.
    for (what, body) in &AMBIGUOUS[..6] {
        let r = client()
            .post(format!("http://{}/mcp", go.addr))
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let v: serde_json::Value = r.json().await.unwrap();
        let ran = &v["result"];
        assert!(
            ran["tool"] == "delete_repo" || ran["kind"] == "delete",
            "{what}: Go ran {ran}"
        );
    }
    let direct = go.ran().await.len();

    // Through tessera, none of them reaches Go; a plain call runs.
    let p = Proxy::start_with_policies(Proxy::dir(), |_| {}, policies(&[])).await;
    let a = p
        .agent("go", &format!("http://{}/mcp", go.addr), "agent")
        .await;
    for (what, body) in AMBIGUOUS {
        let (s, v) = post_with(&a, body, &[]).await;
        assert_refused(s, &v, "ambiguous message", what);
    }
    let (s, v) = post_with(
        &a,
        r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"notes.txt","kind":"read"}}}"#,
        &[],
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let ran = go.ran().await;
    assert_eq!(ran.len(), direct + 1, "{ran:?}");
    assert_eq!(ran[direct]["tool"], "read_file");
    assert_eq!(ran[direct]["kind"], "read");
}
