//! The deployment files, checked for the properties they promise: Docker is
//! not runnable here, so docker-compose.yml, the Dockerfile and the
//! Kubernetes manifest are parsed and their structure asserted.

use serde_json::Value;

fn yaml(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| {
            let v: serde_norway::Value = serde::Deserialize::deserialize(doc).unwrap();
            serde_json::to_value(v).unwrap()
        })
        .collect()
}

fn compose() -> Value {
    yaml("docker-compose.yml").remove(0)
}

/// Every string anywhere in `v`, with the key it is under.
fn strings<'a>(v: &'a Value, key: &'a str, out: &mut Vec<(&'a str, &'a str)>) {
    match v {
        Value::String(s) => out.push((key, s)),
        Value::Array(a) => a.iter().for_each(|x| strings(x, key, out)),
        Value::Object(o) => o.iter().for_each(|(k, x)| strings(x, k, out)),
        _ => {}
    }
}

/// No secret value is written into the compose file: every environment
/// setting named like a secret is a `*_FILE` path under /run/secrets, the
/// secrets themselves are files, and no string anywhere is a URL with a
/// password.
fn assert_no_inlined_secret(c: &Value) {
    for (service, svc) in c["services"].as_object().unwrap() {
        let Some(env) = svc["environment"].as_object() else {
            continue;
        };
        for (key, value) in env {
            let k = key.to_ascii_uppercase();
            let secretish = ["PASSWORD", "SECRET", "TOKEN", "KEY", "DATABASE_URL"]
                .iter()
                .any(|w| k.contains(w));
            if secretish {
                assert!(
                    k.ends_with("_FILE"),
                    "{service}: {key} holds its value inline"
                );
                assert!(
                    value.as_str().unwrap().starts_with("/run/secrets/"),
                    "{service}: {key}"
                );
            }
        }
    }
    for (name, s) in c["secrets"].as_object().unwrap() {
        let keys: Vec<&String> = s.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["file"], "secret {name} is not a file");
    }
    let mut all = Vec::new();
    strings(c, "", &mut all);
    for (key, value) in all {
        assert!(
            !regex_like_password_url(value),
            "{key} holds a URL with a password"
        );
    }
}

/// `scheme://user:password@host`.
fn regex_like_password_url(s: &str) -> bool {
    s.split("://").nth(1).is_some_and(|rest| {
        let authority = rest.split('/').next().unwrap_or("");
        authority
            .rsplit_once('@')
            .is_some_and(|(userinfo, _)| userinfo.contains(':'))
    })
}

#[test]
fn compose_runs_postgres_tessera_and_a_sandbox() {
    let c = compose();
    let s = &c["services"];
    for name in ["postgres", "tessera", "sandbox"] {
        assert!(s[name].is_object(), "no {name} service");
    }

    // Postgres: a named volume for its data, and a healthcheck tessera waits on.
    let pg = &s["postgres"];
    assert!(pg["healthcheck"]["test"].is_array(), "{pg}");
    let vol = pg["volumes"][0].as_str().unwrap();
    let (name, target) = vol.split_once(':').unwrap();
    assert_eq!(target, "/var/lib/postgresql/data");
    assert!(
        c["volumes"][name].is_object(),
        "{name} is not a named volume"
    );
    assert_eq!(
        s["tessera"]["depends_on"]["postgres"]["condition"],
        "service_healthy"
    );

    // tessera: built from the Dockerfile, its port not published, its
    // database URL and master key from secret files.
    let t = &s["tessera"];
    assert_eq!(t["build"]["dockerfile"], "Dockerfile");
    assert!(t.get("ports").is_none(), "tessera's port is published");
    let env = &t["environment"];
    for var in ["TESSERA_DATABASE_URL_FILE", "TESSERA_MASTER_KEY_FILE"] {
        let path = env[var].as_str().unwrap();
        let secret = path.strip_prefix("/run/secrets/").unwrap();
        assert!(
            t["secrets"].as_array().unwrap().iter().any(|x| x == secret),
            "{secret} is not mounted"
        );
        assert!(c["secrets"][secret]["file"].is_string(), "{secret}");
    }
    assert_eq!(t["read_only"], true);
    // Its ops listener drives the healthcheck (the image has no shell or
    // curl) and is what Prometheus scrapes; it is not published either,
    // and it binds tessera's address on the store network alone: /metrics
    // names credentials, and the sandbox network must not reach it.
    let store = &t["networks"]["store"]["ipv4_address"];
    let ops = env["TESSERA_OPS_LISTEN"].as_str().unwrap();
    assert_eq!(ops, format!("{}:7472", store.as_str().unwrap()));
    let subnet = c["networks"]["store"]["ipam"]["config"][0]["subnet"]
        .as_str()
        .unwrap();
    let prefix = subnet.rsplit_once('.').unwrap().0;
    assert!(ops.starts_with(&format!("{prefix}.")), "{ops} in {subnet}");
    assert_eq!(c["networks"]["store"]["internal"], true);
    assert_eq!(
        t["healthcheck"]["test"],
        serde_json::json!(["CMD", "tessera", "probe", "readyz"])
    );
    assert_eq!(t["labels"]["prometheus.io/scrape"], "true");
    assert_eq!(t["labels"]["prometheus.io/port"], "7472");
    assert_eq!(t["labels"]["prometheus.io/path"], "/metrics");

    // The sandbox gets the proxy URL and its token, and reaches tessera
    // and nothing else: one internal network, shared with tessera only.
    let sb = &s["sandbox"];
    assert!(sb.get("ports").is_none());
    let nets: Vec<&str> = sb["networks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert_eq!(nets.len(), 1, "{nets:?}");
    assert_eq!(c["networks"][nets[0]]["internal"], true);
    for (name, svc) in s.as_object().unwrap() {
        // A list of names, or a map of name to settings.
        let on = match &svc["networks"] {
            serde_json::Value::Object(m) => m.contains_key(nets[0]),
            v => v.as_array().unwrap().iter().any(|n| n == nets[0]),
        };
        assert_eq!(on, name == "sandbox" || name == "tessera", "{name}");
    }
    assert!(sb.get("secrets").is_none(), "the sandbox mounts a secret");
    let example = std::fs::read_to_string("deploy/sandbox.env.example").unwrap();
    let vars: Vec<&str> = example
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains('='))
        .map(|l| l.split('=').next().unwrap())
        .collect();
    assert_eq!(vars, ["MCP_URL", "MCP_TOKEN"]);

    assert_no_inlined_secret(&c);
}

#[test]
fn the_secret_files_are_never_committed() {
    let ignore = std::fs::read_to_string(".gitignore").unwrap();
    assert!(ignore.lines().any(|l| l == "deploy/secrets/"));
    assert!(ignore.lines().any(|l| l == "deploy/sandbox.env"));
    let c = compose();
    for (name, s) in c["secrets"].as_object().unwrap() {
        let file = s["file"].as_str().unwrap();
        assert!(file.starts_with("deploy/secrets/"), "{name}: {file}");
    }
}

#[test]
fn the_image_is_multi_stage_small_and_non_root() {
    let d = std::fs::read_to_string("Dockerfile").unwrap();
    let froms: Vec<&str> = d.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 2, "{froms:?}");
    // The runtime stage: distroless (no shell), as a non-root user.
    assert!(froms[1].contains("distroless"), "{}", froms[1]);
    let runtime = &d[d.find(froms[1]).unwrap()..];
    let user = runtime
        .lines()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("no USER in the runtime stage");
    assert!(
        !user.starts_with('0') && !user.starts_with("root"),
        "{user}"
    );
    assert!(runtime.contains("COPY --from=build"));
    assert!(
        !runtime.contains("RUN "),
        "the runtime stage has no shell to RUN with"
    );
}

#[test]
fn the_kubernetes_sidecar_binds_loopback_and_mounts_secrets() {
    let docs = yaml("deploy/kubernetes/sidecar.yaml");
    let dep = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let pod = &dep["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let containers = pod["containers"].as_array().unwrap();
    let by_name = |n: &str| containers.iter().find(|c| c["name"] == n).unwrap();
    let t = by_name("tessera");
    let env = |c: &Value, n: &str| {
        c["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == n)
            .cloned()
    };
    assert_eq!(env(t, "TESSERA_LISTEN").unwrap()["value"], "127.0.0.1:7470");
    // Probes and scrapes on the ops listener, on the pod's address (the
    // kubelet and Prometheus reach the pod there); the data plane stays
    // on loopback.
    assert_eq!(
        env(t, "TESSERA_OPS_LISTEN").unwrap()["value"],
        "0.0.0.0:7472"
    );
    assert_eq!(
        t["livenessProbe"]["httpGet"],
        serde_json::json!({"path": "/livez", "port": 7472})
    );
    assert_eq!(
        t["readinessProbe"]["httpGet"],
        serde_json::json!({"path": "/readyz", "port": 7472})
    );
    let notes = &dep["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(notes["prometheus.io/scrape"], "true");
    assert_eq!(notes["prometheus.io/port"], "7472");
    assert_eq!(notes["prometheus.io/path"], "/metrics");
    assert!(t.get("ports").is_none());
    assert_eq!(t["securityContext"]["readOnlyRootFilesystem"], true);
    // The sandbox container gets the URL and the token only, and mounts
    // none of tessera's secrets.
    let sb = by_name("sandbox");
    let names: Vec<&str> = sb["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["MCP_URL", "MCP_TOKEN"]);
    assert!(sb.get("volumeMounts").is_none());
    for d in &docs {
        assert_ne!(d["kind"], "Service", "the sidecar is not exposed");
        let mut all = Vec::new();
        strings(d, "", &mut all);
        assert!(!all.iter().any(|(_, v)| regex_like_password_url(v)));
    }
}

/// The Prometheus configuration scrapes the ops listener: the compose
/// service by name, the sidecars by their pods' annotations.
#[test]
fn prometheus_scrapes_the_ops_listener() {
    let p = yaml("deploy/prometheus.yml").remove(0);
    let jobs = p["scrape_configs"].as_array().unwrap();
    let compose = jobs.iter().find(|j| j["job_name"] == "tessera").unwrap();
    assert_eq!(compose["metrics_path"], "/metrics");
    assert_eq!(
        compose["static_configs"][0]["targets"],
        serde_json::json!(["tessera:7472"])
    );
    let pods = jobs
        .iter()
        .find(|j| j["job_name"] == "tessera-sidecars")
        .unwrap();
    assert_eq!(pods["kubernetes_sd_configs"][0]["role"], "pod");
    let text = pods["relabel_configs"].to_string();
    assert!(
        text.contains("__meta_kubernetes_pod_annotation_prometheus_io_scrape"),
        "{text}"
    );
}

#[test]
fn a_password_in_a_url_is_seen() {
    assert!(regex_like_password_url("postgres://u:pw@h/db"));
    assert!(!regex_like_password_url("postgres://u@h/db"));
    assert!(!regex_like_password_url("http://tessera:7470"));
}
