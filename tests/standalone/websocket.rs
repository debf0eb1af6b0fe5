//! WebSocket backends by Service port `appProtocol` (GEP-1911): `kubernetes.io/ws` is
//! reached with HTTP/1.1 and its Upgrade, `kubernetes.io/wss` the same over the TLS of
//! the port's BackendTLSPolicy. A WebSocket client (the opening handshake and masked
//! frames, RFC 6455) talks through the real binary to a WebSocket server in this
//! process, which records what it saw (SNI, ALPN, HTTP version, handshake headers) and
//! answers each text frame with an unmasked one of its own.
//! `wss` without a policy, and a GRPCRoute to a WebSocket port, are `UnsupportedProtocol`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::common::*;

/// RFC 6455's example key and the accept value it yields (section 1.3).
pub(crate) const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
pub(crate) const ACCEPT: &str = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";

/// What the server saw of one opening handshake.
#[derive(Debug, Clone)]
struct Handshake {
    sni: Option<String>,
    alpn: Option<String>,
    version: String,
    upgrade: Option<String>,
    key: Option<String>,
}

/// A WebSocket server, over TLS when given a certificate; stops when dropped.
struct WsServer {
    seen: Arc<Mutex<Vec<Handshake>>>,
    task: JoinHandle<()>,
}

impl Drop for WsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl WsServer {
    async fn start(addr: SocketAddr, tls: Option<&Leaf>) -> Result<Self, BoxError> {
        let acceptor = tls.map(|l| l.acceptor(&[b"h2", b"http/1.1"])).transpose()?;
        let listener = TcpListener::bind(addr).await?;
        let seen: Arc<Mutex<Vec<Handshake>>> = Arc::default();
        let log = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, log) = (acceptor.clone(), Arc::clone(&log));
                tokio::spawn(async move {
                    match acceptor {
                        None => serve(tcp, None, None, log).await,
                        Some(a) => {
                            let Ok(tls) = a.accept(tcp).await else { return };
                            let (_, s) = tls.get_ref();
                            let sni = s.server_name().map(str::to_owned);
                            let alpn = s
                                .alpn_protocol()
                                .map(|p| String::from_utf8_lossy(p).into_owned());
                            serve(tls, sni, alpn, log).await;
                        }
                    }
                });
            }
        });
        Ok(Self { seen, task })
    }

    fn handshakes(&self) -> Vec<Handshake> {
        self.seen.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

/// HTTP/1.1 with upgrades: a WebSocket opening handshake gets 101, then frames.
async fn serve<S>(io: S, sni: Option<String>, alpn: Option<String>, log: Arc<Mutex<Vec<Handshake>>>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
        let header = |n: &str| {
            req.headers()
                .get(n)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let hs = Handshake {
            sni: sni.clone(),
            alpn: alpn.clone(),
            version: format!("{:?}", req.version()),
            upgrade: header("upgrade"),
            key: header("sec-websocket-key"),
        };
        let ok = hs.upgrade.as_deref() == Some("websocket") && hs.key.as_deref() == Some(KEY);
        if let Ok(mut l) = log.lock() {
            l.push(hs);
        }
        let upgraded = hyper::upgrade::on(&mut req);
        async move {
            let mut resp = http::Response::new(http_body_util::Empty::<bytes::Bytes>::new());
            if !ok {
                *resp.status_mut() = http::StatusCode::BAD_REQUEST;
                return Ok::<_, std::convert::Infallible>(resp);
            }
            tokio::spawn(async move {
                if let Ok(up) = upgraded.await {
                    let _ = answer_frames(TokioIo::new(up)).await;
                }
            });
            *resp.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
            let h = resp.headers_mut();
            h.insert("connection", http::HeaderValue::from_static("upgrade"));
            h.insert("upgrade", http::HeaderValue::from_static("websocket"));
            h.insert(
                "sec-websocket-accept",
                http::HeaderValue::from_static(ACCEPT),
            );
            Ok(resp)
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades()
        .await;
}

/// Reads masked text frames and answers each with `echo: <text>`, unmasked, as a server
/// must (payloads under 126 bytes: all these tests send).
pub(crate) async fn answer_frames<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
) -> Result<(), BoxError> {
    loop {
        let mut head = [0u8; 2];
        s.read_exact(&mut head).await?;
        ensure!(head[1] & 0x80 != 0, "a client frame must be masked");
        let len = usize::from(head[1] & 0x7f);
        ensure!(len < 126, "long frame");
        let mut mask = [0u8; 4];
        s.read_exact(&mut mask).await?;
        let mut payload = vec![0u8; len];
        s.read_exact(&mut payload).await?;
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
        let reply = [b"echo: ".as_slice(), &payload].concat();
        let mut frame = vec![0x81, u8::try_from(reply.len())?];
        frame.extend_from_slice(&reply);
        s.write_all(&frame).await?;
    }
}

/// A client's opening handshake to `addr` for `host`, then one text frame; returns the
/// 101's head and the text of the server's answering frame.
pub(crate) async fn ws_round_trip(
    net: Net,
    addr: SocketAddr,
    host: &str,
    text: &str,
) -> Result<(String, String), BoxError> {
    let mut s = connect_from(net.client_ip(), addr).await?;
    let req = format!(
        "GET /chat HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {KEY}\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(REQUEST_TIMEOUT, s.read(&mut byte)).await??;
        ensure!(n == 1, "closed after {:?}", String::from_utf8_lossy(&head));
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    ensure!(head.starts_with("http/1.1 101"), "no 101: {head:?}");
    let mask = [0x37, 0xfa, 0x21, 0x3d];
    let mut frame = vec![0x81, 0x80 | u8::try_from(text.len())?];
    frame.extend_from_slice(&mask);
    frame.extend(text.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    s.write_all(&frame).await?;
    let mut h = [0u8; 2];
    tokio::time::timeout(REQUEST_TIMEOUT, s.read_exact(&mut h)).await??;
    ensure!(
        h[0] == 0x81 && h[1] & 0x80 == 0,
        "not an unmasked text frame: {h:?}"
    );
    let mut payload = vec![0u8; usize::from(h[1])];
    tokio::time::timeout(REQUEST_TIMEOUT, s.read_exact(&mut payload)).await??;
    Ok((head, String::from_utf8(payload)?))
}

fn manifests(net: Net, ca: &TestCa) -> String {
    let mut m = edge_gateway(net);
    let svc = |name: &str, app: &str, ep: SocketAddr| {
        Backend::test(name)
            .app_protocol(app)
            .endpoint(ep, true)
            .yaml()
    };
    m.push_str(&svc("ws", "kubernetes.io/ws", net.echo_a()));
    m.push_str(&svc("wss", "kubernetes.io/wss", net.echo_b()));
    m.push_str(&svc("wss-bare", "kubernetes.io/wss", net.echo_b()));
    m.push_str(&ca_config_map("default", "ca", ca));
    m.push_str(
        "---
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {name: wss, namespace: default}
spec:
  targetRefs: [{group: \"\", kind: Service, name: wss}]
  validation: {hostname: ws.internal.example, caCertificateRefs: [{group: \"\", kind: ConfigMap, name: ca}]}
",
    );
    for (name, host) in [
        ("ws", "ws.example.com"),
        ("wss", "wss.example.com"),
        ("wss-bare", "bare.example.com"),
    ] {
        m.push_str(&route(
            "default",
            name,
            "edge",
            &[host],
            &[("PathPrefix", "/", name)],
        ));
    }
    m.push_str(
        "---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: grpc-to-ws, namespace: default}
spec:
  parentRefs: [{name: edge}]
  hostnames: [grpc.example.com]
  rules: [{backendRefs: [{name: ws, port: 80}]}]
",
    );
    m
}

#[tokio::test(flavor = "multi_thread")]
async fn websocket_backends_by_app_protocol_over_http1_and_tls() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let ca = TestCa::new("wss-ca")?;
    let ws = WsServer::start(net.echo_a(), None).await?;
    let wss = WsServer::start(net.echo_b(), Some(&ca.leaf(&["ws.internal.example"])?)).await?;
    env.write_manifest("m.yaml", &manifests(net, &ca))?;
    let _edge = env.spawn_edge("edge").await?;
    let gw = net.gw();
    env.wait_listener(gw).await?;

    let (head, reply) = eventually("ws round trip", Duration::from_secs(10), || {
        ws_round_trip(net, gw, "ws.example.com", "Websocket Support!")
    })
    .await?;
    ensure!(reply == "echo: Websocket Support!", "{reply:?}");
    ensure!(
        head.contains(&format!(
            "sec-websocket-accept: {}",
            ACCEPT.to_ascii_lowercase()
        )),
        "{head}"
    );
    let hs = ws.handshakes();
    let first = hs.first().ok_or_else(|| err("ws server saw nothing"))?;
    ensure!(
        first.version == "HTTP/1.1" && first.sni.is_none(),
        "{first:?}"
    );

    let (_, reply) = ws_round_trip(net, gw, "wss.example.com", "over tls").await?;
    ensure!(reply == "echo: over tls", "{reply:?}");
    let hs = wss.handshakes();
    let first = hs.first().ok_or_else(|| err("wss server saw nothing"))?;
    ensure!(
        first.sni.as_deref() == Some("ws.internal.example")
            && first.alpn.as_deref() == Some("http/1.1")
            && first.version == "HTTP/1.1"
            && first.upgrade.as_deref() == Some("websocket"),
        "{first:?}"
    );

    // wss without a policy is never dialled in plaintext: the rule answers 500.
    let r = env.h1(gw, "bare.example.com", "/").await?;
    ensure!(r.status == 500, "wss without a policy: {}", r.status);
    ensure!(wss.handshakes().len() == 1, "wss-bare reached the server");
    let st = env.status().await?;
    for (kind, name) in [("HTTPRoute", "wss-bare"), ("GRPCRoute", "grpc-to-ws")] {
        let parent = route_parent(status_item(&st, kind, "default", name)?, "edge", None)?;
        expect_condition(
            &parent["conditions"],
            "ResolvedRefs",
            "False",
            Some("UnsupportedProtocol"),
        )?;
    }
    let parent = route_parent(
        status_item(&st, "HTTPRoute", "default", "wss")?,
        "edge",
        None,
    )?;
    expect_condition(
        &parent["conditions"],
        "ResolvedRefs",
        "True",
        Some("ResolvedRefs"),
    )?;
    env.pass()
}
