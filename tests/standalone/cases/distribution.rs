//! Distributions: many requests (or connections, or UDP flows) and the share of each
//! backend among their answers, against the weights a case expects.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use super::*;

/// Sends `dist`'s requests to `addr` and checks each backend's share of the answers.
pub(super) async fn check_distribution(
    net: Net,
    addr: SocketAddr,
    host: &str,
    dist: &Distribution,
) -> TestResult {
    let headers: Vec<(&str, &str)> = dist
        .request
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let method = dist.request.method.as_deref().unwrap_or("GET");
    let path = dist.request.path.as_deref().unwrap_or("/");
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    if dist.request.udp {
        // Each datagram from a socket of its own: a new flow, balanced anew.
        for _ in 0..dist.count {
            let name = udp_echo(net, addr)
                .await
                .unwrap_or_else(|e| format!("<no answer: {e}>"));
            *seen.entry(name).or_default() += 1;
        }
        return shares(dist, &seen);
    }
    let mut conn = H1Conn::connect(net.client_ip(), addr).await?;
    let mut wrong_header = Vec::new();
    for _ in 0..dist.count {
        if dist.connection_per_request {
            conn = H1Conn::connect(net.client_ip(), addr).await?;
        }
        let r = conn.send(method, host, path, &headers).await?;
        let name = match r.echo() {
            Ok(e) => {
                if let Some(h) = &dist.backend_header
                    && e.header(h) != Some(e.name())
                {
                    wrong_header.push(format!("{} saw {h}: {:?}", e.name(), e.header(h)));
                }
                e.name().to_owned()
            }
            Err(_) => format!("<status {}>", r.status.as_u16()),
        };
        *seen.entry(name).or_default() += 1;
    }
    ensure!(
        wrong_header.is_empty(),
        "a backend's own header filter did not reach it: {wrong_header:?}"
    );
    shares(dist, &seen)
}

/// Whether each backend's share of `seen` is the one `dist` expects.
fn shares(dist: &Distribution, seen: &BTreeMap<String, u32>) -> TestResult {
    let total_weight: f64 = dist.backends.values().sum();
    ensure!(total_weight > 0.0, "distribution weights sum to 0");
    let mut diffs = Vec::new();
    let names: BTreeSet<&String> = dist.backends.keys().chain(seen.keys()).collect();
    for name in names {
        let want = dist.backends.get(name).copied().unwrap_or(0.0) / total_weight;
        let got = f64::from(seen.get(name).copied().unwrap_or(0)) / f64::from(dist.count);
        let off = if want == 0.0 {
            got > 0.0
        } else {
            (got - want).abs() > dist.tolerance
        };
        if off {
            diffs.push(format!(
                "{name}: expected share {want:.3} (±{}), got {got:.3}",
                dist.tolerance
            ));
        }
    }
    ensure!(
        diffs.is_empty(),
        "{} (counts of {} requests: {seen:?})",
        diffs.join("; "),
        dist.count
    );
    Ok(())
}
