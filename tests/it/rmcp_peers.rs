//! A real MCP client and server (the official Rust SDK, `rmcp`) talking
//! through tessera over streamable HTTP.

use std::sync::{Arc, Mutex};

use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{CallToolRequestParams, ClientConfig, ServerCapabilities, ServerConfig};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::streamable_http_server::{
    session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{schemars, tool, tool_handler, tool_router, ServerHandler, ServiceExt};

use crate::support::*;

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct SumRequest {
    a: i64,
    b: i64,
}

#[derive(Debug, Clone)]
struct Adder {
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Adder {
    #[tool(description = "Add two numbers")]
    fn sum(&self, Parameters(SumRequest { a, b }): Parameters<SumRequest>) -> String {
        (a + b).to_string()
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Adder {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

/// Start an rmcp streamable-HTTP server; returns its address and the
/// `Authorization` values every request to it carried.
pub(crate) async fn rmcp_server() -> (std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
    let service: StreamableHttpService<Adder, LocalSessionManager> = StreamableHttpService::new(
        || {
            Ok(Adder {
                tool_router: Adder::tool_router(),
            })
        },
        Default::default(),
        StreamableHttpServerConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let auth = Arc::new(Mutex::new(Vec::new()));
    let seen = auth.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let (service, seen) = (service.clone(), seen.clone());
            tokio::spawn(async move {
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let value = req
                            .headers()
                            .get("authorization")
                            .map(|v| v.to_str().unwrap().to_string());
                        seen.lock().unwrap().push(value.unwrap_or_default());
                        let mut service = service.clone();
                        tower_service::Service::call(&mut service, req)
                    });
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                .await;
            });
        }
    });
    (addr, auth)
}

#[tokio::test]
async fn rmcp_client_lists_and_calls_a_tool_through_tessera() {
    let (addr, auth) = rmcp_server().await;
    let p = Proxy::start(Proxy::dir()).await;
    let a = p
        .agent("adder", &format!("http://{addr}/mcp"), "agent")
        .await;

    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(a.url.clone()).auth_header(a.token.clone()),
    );
    let client = ClientConfig::default()
        .serve(transport)
        .await
        .expect("initialize through tessera");
    let tools = client.list_all_tools().await.unwrap();
    assert_eq!(
        tools.iter().map(|t| t.name.as_ref()).collect::<Vec<_>>(),
        ["sum"]
    );
    let args = serde_json::json!({"a": 40, "b": 2})
        .as_object()
        .unwrap()
        .clone();
    let r = client
        .call_tool(CallToolRequestParams::new("sum").with_arguments(args))
        .await
        .unwrap();
    assert_ne!(r.is_error, Some(true));
    let text = serde_json::to_value(&r.content).unwrap().to_string();
    assert!(text.contains("42"), "{text}");
    let _ = client.cancel().await;

    // Every request the server saw carried the stored credential, none the
    // caller's token.
    let seen = auth.lock().unwrap().clone();
    assert!(seen.len() >= 3, "{seen:?}");
    assert!(
        seen.iter().all(|v| *v == format!("Bearer {SECRET}")),
        "{seen:?}"
    );

    // A caller with a wrong token gets tessera's 403, not the server.
    let before = seen.len();
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(a.url.clone()).auth_header("tsr_wrong"),
    );
    assert!(ClientConfig::default().serve(transport).await.is_err());
    assert_eq!(
        auth.lock().unwrap().len(),
        before,
        "a request with a wrong token reached the server"
    );
}
