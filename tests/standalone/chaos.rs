//! Everything at once under a bounded load loop: one of three backends is killed, a
//! route is removed and re-added, the HTTPS listener's Secret is rotated, and the edge
//! is replaced by a second instance (SO_REUSEPORT) that takes over while the first
//! drains after SIGTERM. Every request opens its own connection, HTTP and HTTPS mixed,
//! and every failure is recorded with the phase it happened in, so each one can be
//! explained. The bar is the issue's: under 0.1% failed.
//!
//! What failures remain, and why (seen over repeated runs: 1 to 3 of 10,000):
//! - "backend killed", 502: requests in flight on the backend when it died. The
//!   request had reached it, so replaying it could run it twice; it is not retried.
//! - "edge replaced", a reset or connection error: connections the kernel had queued on
//!   the first edge's socket when it closed (see takeover.rs; `tcp_migrate_req=1`
//!   avoids them).
//!
//! Requests that would have gone to the dead backend before it was ejected are retried
//! on another endpoint (the connect failed, nothing was sent), and the ejection
//! survives the route flap and the Secret rotation, so neither costs a request.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use crate::common::*;

const HTTPS_PORT: u16 = 8443;
const CLIENTS: usize = 4;
const REQUESTS: usize = 10_000;
const HOST: &str = "chaos.example.com";
const FLAP_HOST: &str = "flap.example.com";

/// The phases, in order; a failure is tagged with the one current when it happened.
const PHASES: [&str; 5] = [
    "steady",
    "backend killed",
    "route flapped",
    "secret rotated",
    "edge replaced",
];

/// A Gateway at .5 with HTTP :8080 and HTTPS :8443 (Secret `cert`) and a Service whose
/// EndpointSlice lists three echo backends.
fn infra(net: Net, backends: &[SocketAddr]) -> String {
    let ip = net.ip_str(5);
    let mut m = gateway_class("aether", CONTROLLER);
    m.push_str(
        &Gateway::test("edge")
            .address(&ip)
            .http("http", LISTENER_PORT)
            .https("https", HTTPS_PORT, "cert")
            .yaml(),
    );
    let mut svc = Backend::test("svc");
    for b in backends {
        svc = svc.endpoint(SocketAddr::new(b.ip(), ECHO_PORT), true);
    }
    m.push_str(&svc.yaml());
    m
}

/// Which kind of request a client sends, one per connection.
#[derive(Clone, Copy)]
enum Kind {
    Http,
    Https,
}

struct Loop {
    net: Net,
    ca: Arc<TestCa>,
    sent: AtomicUsize,
    phase: AtomicUsize,
    failures: Mutex<Vec<String>>,
    deadline: Instant,
}

impl Loop {
    async fn one(&self, kind: Kind) -> Result<(), BoxError> {
        let net = self.net;
        let r = match kind {
            Kind::Http => {
                h1_get_from(net.client_ip(), net.addr(5, LISTENER_PORT), HOST, "/").await?
            }
            Kind::Https => {
                let (tls, _) = tls_connect(
                    net.client_ip(),
                    net.addr(5, HTTPS_PORT),
                    HOST,
                    &self.ca,
                    &[b"http/1.1"],
                )
                .await?;
                H1Conn::over(tls).await?.get(HOST, "/").await?
            }
        };
        ensure!(r.status == 200, "status {}", r.status);
        Ok(())
    }

    async fn run(self: Arc<Self>, kind: Kind) {
        while self.sent.fetch_add(1, Ordering::Relaxed) < REQUESTS && Instant::now() < self.deadline
        {
            if let Err(e) = self.one(kind).await {
                let phase = PHASES[self.phase.load(Ordering::Relaxed)];
                let what = match kind {
                    Kind::Http => "http",
                    Kind::Https => "https",
                };
                self.failures
                    .lock()
                    .await
                    .push(format!("[{phase}] {what}: {e}"));
            }
        }
    }

    /// Waits until the loop has sent `n` requests, then enters phase `phase`.
    async fn enter(&self, n: usize, phase: usize) {
        while self.sent.load(Ordering::Relaxed) < n && Instant::now() < self.deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.phase.store(phase, Ordering::Relaxed);
        eprintln!("chaos: {} after {n} requests", PHASES[phase]);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn chaos_kill_flap_rotate_and_takeover_lose_under_a_thousandth() -> TestResult {
    let env = TestEnv::new()?;
    let net = env.net;
    let http = net.addr(5, LISTENER_PORT);
    let backends = [
        net.addr(200, ECHO_PORT),
        net.addr(201, ECHO_PORT),
        net.addr(202, ECHO_PORT),
    ];
    let ca = Arc::new(TestCa::new("aether chaos CA")?);
    let first_cert = ca.leaf(&[HOST])?;
    env.write_manifest("infra.yaml", &infra(net, &backends))?;
    env.write_manifest("secret.yaml", &tls_secret("default", "cert", &first_cert))?;
    env.write_manifest(
        "main-route.yaml",
        &route(
            "default",
            "main",
            "edge",
            &[HOST],
            &[("PathPrefix", "/", "svc")],
        ),
    )?;
    let flap_route = route(
        "default",
        "flap",
        "edge",
        &[FLAP_HOST],
        &[("PathPrefix", "/", "svc")],
    );
    env.write_manifest("flap-route.yaml", &flap_route)?;
    let _a = env.spawn_echo(backends[0], "a").await?;
    let _b = env.spawn_echo(backends[1], "b").await?;
    let mut doomed = env.spawn_echo(backends[2], "c").await?;
    let manifests = [env.manifests()];
    let mut first = env
        .spawn_edge_args("edge-a", &manifests, &["--drain-delay", "500ms"])
        .await?;
    env.wait_listener(http).await?;

    let run = Arc::new(Loop {
        net,
        ca: Arc::clone(&ca),
        sent: AtomicUsize::new(0),
        phase: AtomicUsize::new(0),
        failures: Mutex::new(Vec::new()),
        deadline: Instant::now() + Duration::from_secs(120),
    });
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let kind = if i % 2 == 0 { Kind::Http } else { Kind::Https };
            tokio::spawn(Arc::clone(&run).run(kind))
        })
        .collect();
    let step = REQUESTS / 6;

    // A backend dies without a goodbye: its endpoint stays in the EndpointSlice, as it
    // would until Kubernetes notices, so the edge has to route around it by itself.
    run.enter(step, 1).await;
    doomed.signal("KILL")?;
    doomed.wait_exit(Duration::from_secs(5)).await?;

    // A route goes away and comes back; the main route's traffic must not notice.
    run.enter(2 * step, 2).await;
    let flap_file = env.manifests().join("flap-route.yaml");
    std::fs::remove_file(&flap_file)?;
    eventually("the removed route stops matching", EVENTUALLY, || async {
        let r = env.h1(http, FLAP_HOST, "/").await?;
        ensure!(r.status == 404, "flap route still answers {}", r.status);
        Ok(())
    })
    .await?;
    env.add_manifest_atomically("flap-route.yaml", &flap_route)?;
    eventually("the re-added route matches again", EVENTUALLY, || async {
        let r = env.h1(http, FLAP_HOST, "/").await?;
        ensure!(r.status == 200, "flap route answers {}", r.status);
        Ok(())
    })
    .await?;

    // The certificate is replaced; new handshakes get the new one.
    run.enter(3 * step, 3).await;
    let second_cert = ca.leaf(&[HOST])?;
    env.add_manifest_atomically("secret.yaml", &tls_secret("default", "cert", &second_cert))?;
    eventually(
        "new handshakes present the rotated certificate",
        EVENTUALLY,
        || async {
            let (_, presented) = tls_connect(
                net.client_ip(),
                net.addr(5, HTTPS_PORT),
                HOST,
                &ca,
                &[b"http/1.1"],
            )
            .await?;
            ensure!(
                presented == second_cert.cert_der,
                "still the old certificate"
            );
            Ok(())
        },
    )
    .await?;

    // A second edge binds the same sockets, then the first is told to stop.
    run.enter(4 * step, 4).await;
    let second_admin = net.addr(251, 9901);
    let args: Vec<String> = [
        "run",
        "--manifests",
        &env.manifests().display().to_string(),
        "--admin",
        &second_admin.to_string(),
        "--address-pool",
        &net.pool(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let mut second = env.spawn("edge-b", &args)?;
    eventually("the second edge is ready", EVENTUALLY, || {
        let alive = second.check_alive();
        async move {
            alive?;
            let r = h1_get_from(net.client_ip(), second_admin, "admin", "/readyz").await?;
            ensure!(r.status == 200, "readyz {}", r.status);
            Ok(())
        }
    })
    .await?;
    first.signal("TERM")?;
    let status = first.wait_exit(Duration::from_secs(15)).await?;
    ensure!(status.success(), "the first edge exited with {status}");
    let at_exit = run.sent.load(Ordering::Relaxed);

    for c in clients {
        c.await?;
    }
    let total = run.sent.load(Ordering::Relaxed).min(REQUESTS);
    let failures = run.failures.lock().await.clone();
    eprintln!(
        "chaos: {total} requests, first edge exited after {at_exit}, {} failed: {failures:#?}",
        failures.len()
    );
    ensure!(
        at_exit < REQUESTS,
        "every request was sent before the first edge exited"
    );
    ensure!(
        total == REQUESTS,
        "the loop ran out of time after {total} requests"
    );
    ensure!(
        failures.len() * 1000 <= total,
        "{} of {total} requests failed: {failures:#?}",
        failures.len()
    );
    // The surviving backends carried the load, and the second edge serves alone now.
    let served: usize = ["a", "b"]
        .iter()
        .map(|n| env.echo_requests(n).map(|v| v.len()))
        .sum::<Result<_, _>>()?;
    ensure!(served > 0, "the surviving backends saw no requests");
    let r = env.h1(http, HOST, "/").await?;
    ensure!(r.status == 200, "after the takeover: {}", r.status);
    second.check_alive()?;
    env.pass()
}
