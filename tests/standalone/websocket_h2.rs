//! A WebSocket to a backend the edge reaches over HTTP/2 (`appProtocol:
//! kubernetes.io/h2c`): the client's HTTP/1.1 opening handshake becomes RFC 8441's
//! extended CONNECT (`:protocol websocket`) upstream, and the backend's `200` the
//! client's `101` with the `Sec-WebSocket-Accept` its key asks for. The backend is a
//! real HTTP/2 server in this process that enables extended CONNECT and answers frames;
//! one that does not enable it makes the handshake fail (502) instead of a plain GET.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::common::*;
use crate::websocket::{ACCEPT, answer_frames, ws_round_trip};

/// What the HTTP/2 server saw of one request.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    protocol: Option<String>,
    version: String,
    key: bool,
}

struct H2Server {
    seen: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
}

impl Drop for H2Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl H2Server {
    /// h2c with prior knowledge at `addr`; `extended`: SETTINGS_ENABLE_CONNECT_PROTOCOL.
    async fn start(addr: SocketAddr, extended: bool) -> Result<Self, BoxError> {
        let listener = TcpListener::bind(addr).await?;
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let log = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let log = Arc::clone(&log);
                tokio::spawn(async move {
                    let service =
                        service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
                            let protocol = req
                                .extensions()
                                .get::<hyper::ext::Protocol>()
                                .map(|p| p.as_str().to_owned());
                            let seen = Seen {
                                method: req.method().to_string(),
                                protocol: protocol.clone(),
                                version: format!("{:?}", req.version()),
                                key: req.headers().contains_key("sec-websocket-key"),
                            };
                            if let Ok(mut l) = log.lock() {
                                l.push(seen);
                            }
                            let websocket = req.method() == http::Method::CONNECT
                                && protocol.as_deref() == Some("websocket");
                            let upgraded = hyper::upgrade::on(&mut req);
                            async move {
                                let mut resp = http::Response::new(http_body_util::Empty::<
                                    bytes::Bytes,
                                >::new(
                                ));
                                if websocket {
                                    tokio::spawn(async move {
                                        if let Ok(up) = upgraded.await {
                                            let _ = answer_frames(TokioIo::new(up)).await;
                                        }
                                    });
                                } else {
                                    *resp.status_mut() = http::StatusCode::BAD_REQUEST;
                                }
                                Ok::<_, std::convert::Infallible>(resp)
                            }
                        });
                    let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                    if extended {
                        b.enable_connect_protocol();
                    }
                    let _ = b.serve_connection(TokioIo::new(tcp), service).await;
                });
            }
        });
        Ok(Self { seen, task })
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn websocket_to_an_http2_backend_is_an_extended_connect() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let h2 = H2Server::start(net.echo_a(), true).await?;
    let plain_h2 = H2Server::start(net.echo_b(), false).await?;
    let mut m = edge_gateway(net);
    for (name, ep) in [("h2", net.echo_a()), ("h2-no-connect", net.echo_b())] {
        m.push_str(
            &Backend::test(name)
                .app_protocol("kubernetes.io/h2c")
                .endpoint(ep, true)
                .yaml(),
        );
        let host = format!("{name}.example.com");
        m.push_str(&route(
            "default",
            name,
            "edge",
            &[&host],
            &[("PathPrefix", "/", name)],
        ));
    }
    env.write_manifest("m.yaml", &m)?;
    let _edge = env.spawn_edge("edge").await?;
    let gw = net.gw();
    env.wait_listener(gw).await?;

    let (head, reply) = eventually("a WebSocket over h2", Duration::from_secs(10), || {
        ws_round_trip(net, gw, "h2.example.com", "over h2")
    })
    .await?;
    ensure!(reply == "echo: over h2", "{reply:?}");
    let accept = format!("sec-websocket-accept: {}", ACCEPT.to_ascii_lowercase());
    ensure!(
        head.contains(&accept) && head.contains("upgrade: websocket"),
        "{head}"
    );
    let seen = h2.seen();
    let first = seen
        .first()
        .ok_or_else(|| err("the h2 backend saw nothing"))?;
    ensure!(
        first.method == "CONNECT"
            && first.protocol.as_deref() == Some("websocket")
            && first.version == "HTTP/2.0"
            && !first.key,
        "{first:?}"
    );

    // A peer without extended CONNECT: the handshake fails with 502, and the backend
    // never gets a plain GET it would answer as if no upgrade had been asked for.
    let e = ws_round_trip(net, gw, "h2-no-connect.example.com", "x").await;
    let msg = format!("{e:?}");
    ensure!(
        e.is_err() && msg.contains("no 101") && msg.contains("http/1.1 502"),
        "{msg}"
    );
    ensure!(
        plain_h2.seen().iter().all(|s| s.method != "GET"),
        "the upgrade went as a plain GET: {:?}",
        plain_h2.seen()
    );
    env.pass()
}

/// Mesh mode: the inbound listener (a real Envoy) takes the extended CONNECT over the
/// mTLS HTTP/2 connection and opens the WebSocket to the workload with HTTP/1.1; the
/// client gets its 101 and the upgraded bytes cross both hops (the echo returns them).
#[tokio::test(flavor = "multi_thread")]
async fn mesh_websocket_rides_extended_connect_to_the_inbound_listener() -> TestResult {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let env = TestEnv::new()?;
    let net = env.net;
    let ca = SpiffeCa::new()?;
    let pod_ip = std::net::IpAddr::V4(net.ip(11));
    let edge_files = write_svid(env.dir.path(), "edge", &ca.svid(EDGE_ID, "edge-1")?, &ca)?;
    let mut m = crate::mesh::gateway_and_routes(net, &[("mesh.example", "svc")]);
    m.push_str(&pod("default", "pod-a", "app"));
    m.push_str(&mesh_backend(
        "default",
        "svc",
        ECHO_PORT,
        &[(pod_ip, Some("pod-a"))],
        &[],
    ));
    env.write_manifest("mesh.yaml", &m)?;
    let (_echo, inbound) = env.spawn_app_pod(pod_ip, "pod-a", &ca).await?;
    let _edge = env
        .spawn_serving_mesh_edge(&file_flags(&edge_files))
        .await?;

    let mut s = connect_from(net.client_ip(), net.gw()).await?;
    let req = format!(
        "GET /chat HTTP/1.1\r\nHost: mesh.example\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {}\r\n\r\n",
        crate::websocket::KEY
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
    let accept = format!("sec-websocket-accept: {}", ACCEPT.to_ascii_lowercase());
    ensure!(head.contains(&accept), "{head}");
    for msg in [&b"through the mesh"[..], &b"and back again"[..]] {
        s.write_all(msg).await?;
        let mut got = vec![0u8; msg.len()];
        tokio::time::timeout(REQUEST_TIMEOUT, s.read_exact(&mut got)).await??;
        ensure!(got == msg, "echoed {:?}", String::from_utf8_lossy(&got));
    }
    // It went through the inbound listener as an upgrade (not around it).
    let upgrades = inbound
        .stat("http.inbound.downstream_cx_upgrades_total", net)
        .await?;
    ensure!(upgrades >= 1, "Envoy saw {upgrades} upgrades");
    env.pass()
}
