//! L4 helpers: in-test TCP and UDP backends that say who they are, and manifests for
//! TCP/UDP/TLS listeners and routes.

use std::fmt::Write as _;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};
use tokio::task::JoinHandle;

use super::{BoxError, Gateway, Manifest};

/// A TCP backend: greets each connection with `hello from <name>\n`, echoes what it
/// reads, and when the client half-closes answers `bye <bytes read>\n` and closes.
pub async fn tcp_backend(addr: SocketAddr, name: &str) -> Result<JoinHandle<()>, BoxError> {
    let listener = TcpListener::bind(addr).await?;
    let name = name.to_owned();
    Ok(tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let name = name.clone();
            tokio::spawn(async move {
                let _ = s.write_all(format!("hello from {name}\n").as_bytes()).await;
                let mut buf = [0u8; 4096];
                let mut total = 0usize;
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            total += n;
                            if s.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
                let _ = s.write_all(format!("bye {total}\n").as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    }))
}

/// A UDP backend answering each datagram with `<name>:<payload>`.
pub async fn udp_backend(addr: SocketAddr, name: &str) -> Result<JoinHandle<()>, BoxError> {
    let socket = UdpSocket::bind(addr).await?;
    let prefix = format!("{name}:").into_bytes();
    Ok(tokio::spawn(async move {
        let mut buf = vec![0u8; 65536];
        while let Ok((n, from)) = socket.recv_from(&mut buf).await {
            let mut out = prefix.clone();
            out.extend_from_slice(&buf[..n]);
            let _ = socket.send_to(&out, from).await;
        }
    }))
}

/// A Gateway `ns/name` of class `aether` at `ip` with listeners `(name, port, protocol)`;
/// protocol `TLS` listeners get `tls.mode: Passthrough`.
pub fn l4_gateway(ns: &str, name: &str, ip: &str, listeners: &[(&str, u16, &str)]) -> String {
    let mut gw = Gateway::test(name).namespace(ns).address(ip);
    for (lname, port, protocol) in listeners {
        let mut l = serde_json::json!({"name": lname, "port": port, "protocol": protocol});
        if *protocol == "TLS" {
            l["tls"] = serde_json::json!({"mode": "Passthrough"});
        }
        gw = gw.listener(l);
    }
    gw.yaml()
}

/// A TCPRoute/UDPRoute/TLSRoute (`kind`) in `default` attached to `default/<gateway>`
/// (listener `section` when given), forwarding to Service port 80 of each `(svc, weight)`.
pub fn l4_route(
    kind: &str,
    name: &str,
    gateway: &str,
    section: Option<&str>,
    hostnames: &[&str],
    backends: &[(&str, u32)],
) -> String {
    let mut s = format!(
        "---
apiVersion: gateway.networking.k8s.io/v1
kind: {kind}
metadata:
  name: {name}
  namespace: default
spec:
  parentRefs:
  - name: {gateway}
"
    );
    if let Some(sec) = section {
        let _ = writeln!(s, "    sectionName: {sec}");
    }
    if !hostnames.is_empty() {
        let _ = writeln!(s, "  hostnames: [{}]", hostnames.join(", "));
    }
    s.push_str("  rules:\n  - backendRefs:\n");
    for (svc, weight) in backends {
        let _ = writeln!(s, "    - {{name: {svc}, port: 80, weight: {weight}}}");
    }
    s
}
