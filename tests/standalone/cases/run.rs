//! Running one case: processes, requests and their checks (what a case starts from:
//! `setup.rs`; distributions: `distribution.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;

// ---------------------------------------------------------------------------------------
// Running one case
// ---------------------------------------------------------------------------------------

/// Runs one case; returns its mismatches (empty: passed).
pub(super) async fn run_case(lc: Arc<LoadedCase>) -> Vec<String> {
    let started = Instant::now();
    let net = Net::allocate();
    if lc.case.well_known_ports
        && let Some(why) = well_known_ports_refused(net)
    {
        if std::env::var("AETHER_REQUIRE_K8S").is_ok_and(|v| v == "1") {
            return vec![format!("{why}, and AETHER_REQUIRE_K8S=1")];
        }
        eprintln!("SKIPPED: case {}: {why}", lc.name);
        return Vec::new();
    }
    let mut failures = Vec::new();
    if let Err(e) = run_case_inner(net, &lc, &mut failures).await {
        failures.push(format!("setup: {e}"));
    }
    eprintln!(
        "case {} on 127.{}.{}.0/24: {} after {:?}",
        lc.name,
        net.b,
        net.k,
        if failures.is_empty() {
            "passed".to_owned()
        } else {
            format!("{} failure(s)", failures.len())
        },
        started.elapsed()
    );
    failures
}

/// Why this process may not listen on ports 80 and 443 of the case's network (a
/// `wellKnownPorts` case needs to), found by trying: None when it may.
fn well_known_ports_refused(net: Net) -> Option<String> {
    for port in [80, 443] {
        // .249 is no address the runner gives out (pool .0/28, clients .100, echoes
        // .200+, admin .250, the claim .254).
        let addr = SocketAddr::new(IpAddr::V4(net.ip(249)), port);
        match std::net::TcpListener::bind(addr) {
            Ok(probe) => drop(probe),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Some(format!(
                    "the case listens on port {port}, and this process may not bind it \
                     ({addr}: {e}; needs root or CAP_NET_BIND_SERVICE)"
                ));
            }
            // Anything else is the edge's to meet: its listener then fails the case.
            Err(_) => {}
        }
    }
    None
}

pub(super) async fn run_case_inner(
    net: Net,
    lc: &LoadedCase,
    failures: &mut Vec<String>,
) -> TestResult {
    let case = &lc.case;
    let env = TestEnv::on(net)?;
    let base = if case.base {
        std::fs::read_to_string(cases_dir().join("base.yaml"))?
    } else {
        String::new()
    };
    let (pki, certificates) = Pki::make(&case.certificates)?;
    let manifests = fill_in(net, &case.backends, &pki, &lc.manifests)?;
    let mut docs = yaml_docs(&base)?;
    docs.extend(yaml_docs(&manifests)?);
    let gateways = gateways_of(&docs);
    env.write_manifest(
        "00-generated.yaml",
        &generated_manifests(net, &case.backends, &case.app_protocols)?,
    )?;
    if case.base {
        env.write_manifest("01-base.yaml", &base)?;
    }
    env.write_manifest("10-case.yaml", &manifests)?;
    if !certificates.is_empty() {
        env.write_manifest("05-certificates.yaml", &certificates)?;
    }

    let mut procs = Vec::new();
    for (i, b) in case.backends.iter().enumerate() {
        let (_, name) = split_ref(b);
        let listen = SocketAddr::new(backend_ip(net, i)?, ECHO_PORT);
        procs.push(match pki.backends.get(b) {
            Some((leaf, client_ca)) => {
                env.spawn_tls_echo(listen, name, leaf, client_ca.as_deref())
                    .await?
            }
            // Every plain echo answers datagrams too, for UDPRoute cases.
            None => env.spawn_echo_with(listen, name, &["--udp"]).await?,
        });
    }
    let extra: Vec<&str> = case.edge_args.iter().map(String::as_str).collect();
    let edge = env
        .spawn_edge_args("edge", &[env.manifests()], &extra)
        .await?;

    // Status first: it also tells the Gateway addresses.
    check_status(&env, &case.status, "status", failures).await;

    let default_gw = case.gateway.as_deref().unwrap_or(DEFAULT_GATEWAY);
    let needs_gateway = |r: &Request| r.gateway.clone().unwrap_or_else(|| default_gw.to_owned());
    let mut used: BTreeSet<String> = case
        .requests
        .iter()
        .map(|r| needs_gateway(&r.request))
        .collect();
    used.extend(case.distributions.iter().map(|d| needs_gateway(&d.request)));
    let mut addrs: BTreeMap<String, IpAddr> = BTreeMap::new();
    for g in &used {
        let (ns, name) = split_ref(g);
        let ip = eventually(
            &format!("Gateway {g} has an address"),
            EVENTUALLY,
            || async {
                let status = env.status().await?;
                let item = status_item(&status, "Gateway", ns, name)?;
                let a = gateway_addresses(item);
                let first = a
                    .first()
                    .ok_or_else(|| err(format!("no address in {}", item["status"])))?;
                Ok(first.parse::<IpAddr>()?)
            },
        )
        .await?;
        addrs.insert(g.clone(), ip);
    }

    let target = |r: &Request| -> Result<(SocketAddr, String), BoxError> {
        let g = needs_gateway(r);
        let ip = addrs
            .get(&g)
            .ok_or_else(|| err(format!("Gateway {g} has no address")))?;
        let port = match r.port {
            Some(p) => p,
            None => gateways
                .get(&g)
                .and_then(|i| i.listeners.first())
                .map(|l| l.1)
                .ok_or_else(|| err(format!("Gateway {g} has no listener")))?,
        };
        let addr = SocketAddr::new(*ip, port);
        let host = r.host.clone().unwrap_or_else(|| addr.to_string());
        Ok((addr, host))
    };

    // The listeners the requests go to; a listener the case expects to be rejected
    // (its status says so) is never waited for.
    let mut listening: BTreeSet<SocketAddr> = BTreeSet::new();
    let requests = case
        .requests
        .iter()
        .filter(|rc| !rc.expect.tls_refused)
        .map(|rc| &rc.request);
    for r in requests.chain(case.distributions.iter().map(|d| &d.request)) {
        let (addr, _) = target(r)?;
        if !listening.insert(addr) {
            continue;
        }
        // A UDP listener accepts no connection: its requests retry until they settle.
        if r.udp {
            continue;
        }
        // A TLS listener has no plain-HTTP readiness answer: it is up once it accepts.
        let up = if r.tls.is_some() {
            eventually(&format!("listener {addr} accepts"), EVENTUALLY, || async {
                connect_from(net.client_ip(), addr).await.map(drop)
            })
            .await
        } else {
            env.wait_listener(addr).await
        };
        if let Err(e) = up {
            failures.push(format!("listener {} {addr}: {e}", needs_gateway(r)));
        }
    }

    for (i, rc) in case.requests.iter().enumerate() {
        let (addr, host) = target(&rc.request)?;
        let label = describe(i, &rc.request, &host);
        let deadline = Instant::now() + REQUEST_SETTLE;
        loop {
            let req = with_fresh_uuid(&rc.request);
            if !rc.expect.upgraded_echo.is_empty() || req.udp {
                let diffs = if req.udp {
                    udp_diffs(net, addr, &rc.expect).await
                } else {
                    upgrade_diffs(net, addr, &host, &req, &rc.expect).await
                };
                if diffs.is_empty() {
                    break;
                }
                if Instant::now() >= deadline {
                    failures.push(format!("{label}:\n    {}", diffs.join("\n    ")));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            let sent = send(net, &pki, addr, &host, &req).await;
            let mut diffs = match sent {
                Ok(resp) if rc.expect.tls_refused => vec![format!(
                    "expected the TLS handshake refused, got status {}",
                    resp.status
                )],
                Ok(resp) => response_diffs(&resp, &req, &host, &rc.expect),
                Err(_) if rc.expect.tls_refused => Vec::new(),
                Err(e) => vec![format!("request failed: {e}")],
            };
            if diffs.is_empty() {
                diffs = mirror_diffs(&env, &req, &rc.expect).await;
            }
            if diffs.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                failures.push(format!("{label}:\n    {}", diffs.join("\n    ")));
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    for (i, d) in case.distributions.iter().enumerate() {
        let (addr, host) = target(&d.request)?;
        let label = format!("distribution {}", describe(i, &d.request, &host));
        if let Err(e) = check_distribution(net, addr, &host, d).await {
            failures.push(format!("{label}:\n    {e}"));
        }
    }

    for (i, (update, text)) in case.updates.iter().zip(&lc.updates).enumerate() {
        let text = fill_in(net, &case.backends, &pki, text)?;
        env.write_manifest("10-case.yaml", &text)?;
        let label = format!("update {} ({})", i + 1, update.manifests);
        check_status(&env, &update.status, &label, failures).await;
    }

    if !failures.is_empty() {
        let log = edge.log();
        let tail: Vec<&str> = log.lines().rev().take(8).collect();
        let mut lines = tail.into_iter().rev().collect::<Vec<_>>().join("\n      ");
        if lines.is_empty() {
            lines = "(empty)".to_owned();
        }
        failures.push(format!("edge log (last lines):\n      {lines}"));
    }
    // Mismatches are reported by the runner; child logs are not needed on drop.
    env.pass()?;
    drop(procs);
    Ok(())
}

/// Waits for `/status` to show what `want` says; a mismatch left at the deadline is a
/// failure named `label`.
async fn check_status(
    env: &TestEnv,
    want: &[StatusExpect],
    label: &str,
    failures: &mut Vec<String>,
) {
    if want.is_empty() {
        return;
    }
    let settle = Wait {
        timeout: STATUS_SETTLE,
        interval: Duration::from_millis(100),
    };
    let last = eventually(&format!("the {label} the case expects"), settle, || async {
        let status = env.status().await?;
        let diffs = status_diffs(&status, want);
        if diffs.is_empty() {
            Ok(())
        } else {
            Err(err(diffs.join("\n    ")))
        }
    })
    .await;
    if let Err(e) = last {
        failures.push(format!("{label}:\n    {e}"));
    }
}

/// The request with every `{uuid}` in its path replaced by a value no other send
/// uses, as the suite's retry tests make a new uuid for each probe.
fn with_fresh_uuid(r: &Request) -> Request {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let mut r = r.clone();
    if let Some(p) = r.path.as_mut().filter(|p| p.contains("{uuid}")) {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *p = p.replace("{uuid}", &format!("{}-{n}", std::process::id()));
    }
    r
}

pub(super) fn describe(i: usize, r: &Request, host: &str) -> String {
    let mut s = format!(
        "request #{} {} http://{host}{}",
        i + 1,
        r.method.as_deref().unwrap_or("GET"),
        r.path.as_deref().unwrap_or("/")
    );
    if let Some(g) = &r.gateway {
        let _ = write!(s, " (gateway {g}");
        if let Some(p) = r.port {
            let _ = write!(s, ", port {p}");
        }
        s.push(')');
    } else if let Some(p) = r.port {
        let _ = write!(s, " (port {p})");
    }
    if !r.headers.is_empty() {
        let _ = write!(s, " headers {:?}", r.headers);
    }
    s
}

/// Sends `r` to `addr`: plain HTTP/1.1, or over TLS as `r.tls` says (HTTP/2 when
/// it asks for it).
pub(super) async fn send(
    net: Net,
    pki: &Pki,
    addr: SocketAddr,
    host: &str,
    r: &Request,
) -> Result<Resp, BoxError> {
    let headers: Vec<(&str, &str)> = r
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let method = r.method.as_deref().unwrap_or("GET");
    let path = r.path.as_deref().unwrap_or("/");
    match &r.tls {
        None => {
            let mut conn = H1Conn::connect(net.client_ip(), addr).await?;
            conn.send(method, host, path, &headers).await
        }
        Some(tls) if tls.http2 => {
            let stream = pki.connect(net, addr, host, tls).await?;
            H2Conn::over(stream)
                .await?
                .send(method, host, path, &headers)
                .await
        }
        Some(tls) => {
            let stream = pki.connect(net, addr, host, tls).await?;
            H1Conn::over(stream)
                .await?
                .send(method, host, path, &headers)
                .await
        }
    }
}

/// Mirrors are fire-and-forget: give each named backend a moment to log the copy.
async fn mirror_diffs(env: &TestEnv, req: &Request, exp: &Expect) -> Vec<String> {
    let want_path = exp
        .backend_request
        .as_ref()
        .and_then(|b| b.path.as_deref())
        .or(req.path.as_deref())
        .unwrap_or("/");
    let mut diffs = Vec::new();
    for name in &exp.mirrored_to {
        let seen = eventually(
            &format!("mirror {name} sees {want_path}"),
            Duration::from_secs(3),
            || async {
                let reqs = env.echo_requests(name)?;
                ensure!(
                    reqs.iter().any(|e| e.path() == want_path),
                    "no mirrored request for {want_path} among {} requests",
                    reqs.len()
                );
                Ok(())
            },
        )
        .await;
        if let Err(e) = seen {
            diffs.push(format!("mirror {name}: {e}"));
        }
    }
    diffs
}

/// Header values as a list: comma-separated elements, trimmed.
pub(super) fn value_list(v: &str) -> Vec<String> {
    v.split(',').map(|s| s.trim().to_owned()).collect()
}

pub(super) fn response_diffs(resp: &Resp, req: &Request, host: &str, exp: &Expect) -> Vec<String> {
    let mut d = Vec::new();
    let want_status = exp.status.unwrap_or(200);
    if resp.status.as_u16() != want_status {
        let mut body = resp.text();
        body.truncate(300);
        d.push(format!(
            "status: expected {want_status}, got {} (body {body:?})",
            resp.status.as_u16()
        ));
    }
    for (k, want) in &exp.headers {
        let got: Vec<&str> = resp
            .headers
            .get_all(k.as_str())
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        if got.is_empty() {
            d.push(format!("response header {k}: expected {want:?}, absent"));
        } else if value_list(&got.join(",")) != value_list(want) {
            d.push(format!(
                "response header {k}: expected {want:?}, got {:?}",
                got.join(", ")
            ));
        }
    }
    for k in &exp.absent_headers {
        if let Some(v) = resp.headers.get(k.as_str()) {
            d.push(format!("response header {k}: expected absent, got {v:?}"));
        }
    }
    if exp.backend.is_none() && exp.backend_request.is_none() {
        return d;
    }
    let echo = match resp.json() {
        Ok(v) if resp.status.is_success() => Echo(v),
        _ => {
            if d.is_empty() {
                d.push(format!(
                    "expected an echo backend answer, got {}: {:?}",
                    resp.status,
                    resp.text()
                ));
            }
            return d;
        }
    };
    if let Some(b) = &exp.backend
        && echo.name() != b
    {
        d.push(format!("backend: expected {b}, got {}", echo.name()));
    }
    let empty = BackendRequest::default();
    let br = exp.backend_request.as_ref().unwrap_or(&empty);
    let want_method = br
        .method
        .as_deref()
        .or(req.method.as_deref())
        .unwrap_or("GET");
    if echo.method() != want_method {
        d.push(format!(
            "backend saw method {:?}, expected {want_method:?}",
            echo.method()
        ));
    }
    let want_path = br.path.as_deref().or(req.path.as_deref()).unwrap_or("/");
    if echo.path() != want_path {
        d.push(format!(
            "backend saw path {:?}, expected {want_path:?}",
            echo.path()
        ));
    }
    let want_host = br.host.as_deref().unwrap_or(host);
    if !echo.host().eq_ignore_ascii_case(want_host) {
        d.push(format!(
            "backend saw host {:?}, expected {want_host:?}",
            echo.host()
        ));
    }
    if let Some(want) = &br.protocol
        && echo.protocol() != want
    {
        d.push(format!(
            "backend saw protocol {:?}, expected {want:?}",
            echo.protocol()
        ));
    }
    if let Some(want) = &br.sni {
        let got = echo.0["sni"].as_str();
        if got != Some(want.as_str()) {
            d.push(format!("backend saw SNI {got:?}, expected {want:?}"));
        }
    }
    for (k, want) in &br.headers {
        match echo.header(&k.to_ascii_lowercase()) {
            None => d.push(format!(
                "backend saw no header {k}, expected {want:?} (saw headers {})",
                echo.0["headers"]
            )),
            Some(got) if value_list(got) != value_list(want) => d.push(format!(
                "backend saw header {k}: {got:?}, expected {want:?}"
            )),
            Some(_) => {}
        }
    }
    for k in &br.absent_headers {
        if let Some(got) = echo.header(&k.to_ascii_lowercase()) {
            d.push(format!(
                "backend saw header {k}: {got:?}, expected it absent"
            ));
        }
    }
    d
}
