//! Requests that are not plain HTTP: UDP datagrams (`udp`), and upgrades
//! (`expect.upgradedEcho`). An upgrade is a raw HTTP/1.1 exchange, so
//! the runner sees the edge's `101` as a WebSocket client would, then bytes through the
//! upgraded connection. The echo backends return every byte sent after their `101`, so
//! what comes back has crossed the edge to the backend and back.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

/// Sends `r` as an upgrade request to `addr` and checks the answer's head against
/// `exp`, then each of `exp.upgraded_echo` through the upgraded connection.
pub(super) async fn upgrade_diffs(
    net: Net,
    addr: SocketAddr,
    host: &str,
    r: &Request,
    exp: &Expect,
) -> Vec<String> {
    match exchange(net, addr, host, r, exp).await {
        Ok(d) => d,
        Err(e) => vec![format!("upgrade failed: {e}")],
    }
}

async fn exchange(
    net: Net,
    addr: SocketAddr,
    host: &str,
    r: &Request,
    exp: &Expect,
) -> Result<Vec<String>, BoxError> {
    ensure!(r.tls.is_none(), "upgradedEcho is for plain HTTP requests");
    let mut head = format!(
        "{} {} HTTP/1.1\r\nhost: {host}\r\n",
        r.method.as_deref().unwrap_or("GET"),
        r.path.as_deref().unwrap_or("/")
    );
    for (k, v) in &r.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut s = connect_from(net.client_ip(), addr).await?;
    s.write_all(head.as_bytes()).await?;
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let end = loop {
        if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = tokio::time::timeout(REQUEST_TIMEOUT, s.read(&mut buf)).await??;
        ensure!(
            n > 0,
            "closed before an answer: {:?}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    };
    // Bytes past the head already belong to the upgraded stream.
    let mut early = got.split_off(end);
    let text = String::from_utf8_lossy(&got).into_owned();
    let mut lines = text.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| err(format!("no status line in {text:?}")))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut d = Vec::new();
    let want = exp.status.unwrap_or(101);
    if status != want {
        d.push(format!("status: expected {want}, got {status} ({text:?})"));
        return Ok(d);
    }
    for (k, want) in &exp.headers {
        let got: Vec<&str> = headers
            .iter()
            .filter(|(h, _)| h.eq_ignore_ascii_case(k))
            .map(|(_, v)| v.as_str())
            .collect();
        if value_list(&got.join(",")) != value_list(want) {
            d.push(format!(
                "response header {k}: expected {want:?}, got {got:?}"
            ));
        }
    }
    for msg in &exp.upgraded_echo {
        s.write_all(msg.as_bytes()).await?;
        let mut back = std::mem::take(&mut early);
        while back.len() < msg.len() {
            let n = tokio::time::timeout(REQUEST_TIMEOUT, s.read(&mut buf)).await??;
            ensure!(n > 0, "upgraded connection closed after {back:?}");
            back.extend_from_slice(&buf[..n]);
        }
        early = back.split_off(msg.len());
        if back != msg.as_bytes() {
            d.push(format!(
                "upgraded connection: sent {msg:?}, got back {:?}",
                String::from_utf8_lossy(&back)
            ));
        }
    }
    Ok(d)
}

/// The probe the suite's UDP tests send.
const UDP_PROBE: &[u8] = b"gateway-api-conformance-udp-echo\n";

/// Sends one datagram to `addr` from a socket of its own and returns the name of the
/// echo that answered.
pub(super) async fn udp_echo(net: Net, addr: SocketAddr) -> Result<String, BoxError> {
    let socket = tokio::net::UdpSocket::bind(SocketAddr::new(net.client_ip(), 0)).await?;
    socket.send_to(UDP_PROBE, addr).await?;
    let mut buf = vec![0u8; 4096];
    let (n, _) = tokio::time::timeout(Duration::from_secs(1), socket.recv_from(&mut buf)).await??;
    let answer: serde_json::Value = serde_json::from_slice(buf.get(..n).unwrap_or_default())?;
    ensure!(
        answer["request"].as_str().map(str::as_bytes) == Some(UDP_PROBE),
        "the echo got another datagram than was sent: {answer}"
    );
    answer["name"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| err(format!("no name in {answer}")))
}

/// A UDP request's mismatches: no answer, or one from another echo than expected.
pub(super) async fn udp_diffs(net: Net, addr: SocketAddr, exp: &Expect) -> Vec<String> {
    match (udp_echo(net, addr).await, &exp.backend) {
        (Err(e), _) => vec![format!("no UDP answer: {e}")],
        (Ok(name), Some(want)) if &name != want => {
            vec![format!("UDP answer from {name}, expected {want}")]
        }
        (Ok(_), _) => Vec::new(),
    }
}
