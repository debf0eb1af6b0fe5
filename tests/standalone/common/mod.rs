//! The standalone suite's harness: a [`TestEnv`] per test (its network, tempdir and
//! processes), the edge and echo backends started on it, and the suite's fixtures
//! (TLS, mesh, L4, Envoy). What both suites share (errors, `eventually`, processes,
//! networks and ports, HTTP and admin clients) is the `aether-test-support` crate
//! (tests/support), re-exported here.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::Value;

pub use aether_test_support::{ensure, *};

/// One test's world: a tempdir with the manifests and logs, and a flag that says
/// whether the test reached its end (if not, child logs are printed on drop).
pub struct TestEnv {
    pub net: Net,
    pub dir: tempfile::TempDir,
    passed: Arc<AtomicBool>,
    started: Instant,
}

impl TestEnv {
    /// On a network of its own ([`Net::allocate`]).
    pub fn new() -> Result<Self, BoxError> {
        Self::on(Net::allocate())
    }

    /// Like `new`, on a given 127.b.k.0/24 network.
    pub fn on(net: Net) -> Result<Self, BoxError> {
        let dir = tempfile::Builder::new()
            .prefix(&if net.b == NET_B {
                format!("aether-standalone-{}-", net.k)
            } else {
                format!("aether-standalone-{}-{}-", net.b, net.k)
            })
            .tempdir()?;
        std::fs::create_dir_all(dir.path().join("manifests"))?;
        Ok(Self {
            net,
            dir,
            passed: Arc::new(AtomicBool::new(false)),
            started: Instant::now(),
        })
    }

    pub fn manifests(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }

    /// Writes (or overwrites in place) a manifest file.
    pub fn write_manifest(&self, name: &str, yaml: &str) -> Result<PathBuf, BoxError> {
        let path = self.manifests().join(name);
        std::fs::write(&path, yaml)?;
        Ok(path)
    }

    /// Adds a manifest file atomically: written under a non-YAML name, then renamed.
    pub fn add_manifest_atomically(&self, name: &str, yaml: &str) -> Result<PathBuf, BoxError> {
        let tmp = self.dir.path().join(format!(".{name}.tmp"));
        std::fs::write(&tmp, yaml)?;
        let path = self.manifests().join(name);
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }

    /// Marks the test as passed; call as the last expression of the test.
    pub fn pass(&self) -> TestResult {
        self.passed.store(true, Ordering::SeqCst);
        eprintln!(
            "test on 127.{}.{}.0/24 passed after {:?}",
            self.net.b,
            self.net.k,
            self.started.elapsed()
        );
        Ok(())
    }

    /// Starts the binary with `args`. Its stderr (process logs) goes to `<label>.log`
    /// and its stdout (the edge's access log) to `<label>.stdout.log`.
    pub fn spawn(&self, label: &str, args: &[String]) -> Result<Proc, BoxError> {
        let rust_log = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_owned());
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_aether-edge"));
        cmd.args(args).env("RUST_LOG", rust_log);
        self.spawn_cmd(cmd, label)
    }

    /// Starts any command the same way (logs in this test's directory, printed unless
    /// the test passes).
    pub fn spawn_cmd(&self, cmd: Command, label: &str) -> Result<Proc, BoxError> {
        Ok(Proc::spawn(cmd, label, self.dir.path())?.until_passed(&self.passed))
    }

    /// Starts `aether-edge echo` and waits until it answers.
    /// Like [`TestEnv::spawn_echo`], serving TLS with `leaf` (the answers then report
    /// the SNI), requiring client certificates from `client_ca` (PEM) when given; it is
    /// up once it accepts connections.
    pub async fn spawn_tls_echo(
        &self,
        listen: SocketAddr,
        name: &str,
        leaf: &Leaf,
        client_ca: Option<&str>,
    ) -> Result<Proc, BoxError> {
        let cert = self.dir.path().join(format!("echo-{name}.crt"));
        let key = self.dir.path().join(format!("echo-{name}.key"));
        std::fs::write(&cert, &leaf.cert_pem)?;
        std::fs::write(&key, &leaf.key_pem)?;
        let mut args: Vec<String> = ["echo", "--listen", &listen.to_string(), "--name", name]
            .map(str::to_owned)
            .to_vec();
        args.extend([
            "--log".to_owned(),
            self.echo_log(name).display().to_string(),
            "--tls-cert".to_owned(),
            cert.display().to_string(),
            "--tls-key".to_owned(),
            key.display().to_string(),
        ]);
        if let Some(pem) = client_ca {
            let ca = self.dir.path().join(format!("echo-{name}.client-ca.crt"));
            std::fs::write(&ca, pem)?;
            args.extend(["--tls-client-ca".to_owned(), ca.display().to_string()]);
        }
        let mut proc = self.spawn(&format!("echo-{name}"), &args)?;
        let client = self.net.client_ip();
        eventually(
            &format!("TLS echo {name} at {listen} accepts"),
            EVENTUALLY,
            || {
                let alive = proc.check_alive();
                async move {
                    alive?;
                    connect_from(client, listen).await.map(drop)
                }
            },
        )
        .await?;
        Ok(proc)
    }

    pub async fn spawn_echo(&self, listen: SocketAddr, name: &str) -> Result<Proc, BoxError> {
        self.spawn_echo_with(listen, name, &[]).await
    }

    /// Like [`TestEnv::spawn_echo`], with more `echo` flags (`--udp`).
    pub async fn spawn_echo_with(
        &self,
        listen: SocketAddr,
        name: &str,
        extra: &[&str],
    ) -> Result<Proc, BoxError> {
        let mut args = vec![
            "echo".to_owned(),
            "--listen".to_owned(),
            listen.to_string(),
            "--name".to_owned(),
            name.to_owned(),
            "--log".to_owned(),
            self.echo_log(name).display().to_string(),
        ];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let mut proc = self.spawn(&format!("echo-{name}"), &args)?;
        let client = self.net.client_ip();
        eventually(
            &format!("echo {name} at {listen} answers"),
            EVENTUALLY,
            || {
                let alive = proc.check_alive();
                async move {
                    alive?;
                    let r = h1_get_from(client, listen, "echo.test", "/").await?;
                    ensure!(r.status == StatusCode::OK, "echo answered {}", r.status);
                    Ok(())
                }
            },
        )
        .await?;
        Ok(proc)
    }

    /// Where echo backend `name` records the requests it receives.
    pub fn echo_log(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("echo-{name}.requests.jsonl"))
    }

    /// Every request echo backend `name` has received so far.
    pub fn echo_requests(&self, name: &str) -> Result<Vec<Echo>, BoxError> {
        let text = std::fs::read_to_string(self.echo_log(name)).unwrap_or_default();
        text.lines()
            .map(|l| Ok(Echo(serde_json::from_str(l)?)))
            .collect()
    }

    /// Starts both echo backends, "a" on .251 and "b" on .252.
    pub async fn spawn_echoes(&self) -> Result<(Proc, Proc), BoxError> {
        let a = self.spawn_echo(self.net.echo_a(), "a").await?;
        let b = self.spawn_echo(self.net.echo_b(), "b").await?;
        Ok((a, b))
    }

    /// Starts `aether-edge run` on this test's manifests, admin and pool, and waits for
    /// admin `/readyz` to answer 200.
    pub async fn spawn_edge(&self, label: &str) -> Result<Proc, BoxError> {
        self.spawn_edge_with(label, &[self.manifests()]).await
    }

    /// Like `spawn_edge`, with one `--manifests` flag per path.
    pub async fn spawn_edge_with(
        &self,
        label: &str,
        manifests: &[PathBuf],
    ) -> Result<Proc, BoxError> {
        self.spawn_edge_args(label, manifests, &[]).await
    }

    /// Like `spawn_edge_with`, with extra command-line flags.
    pub async fn spawn_edge_args(
        &self,
        label: &str,
        manifests: &[PathBuf],
        extra: &[&str],
    ) -> Result<Proc, BoxError> {
        let mut args = vec!["run".to_owned()];
        for m in manifests {
            args.push("--manifests".to_owned());
            args.push(m.display().to_string());
        }
        args.extend([
            "--admin".to_owned(),
            self.net.admin().to_string(),
            "--address-pool".to_owned(),
            self.net.pool(),
            "--drain-timeout".to_owned(),
            "5s".to_owned(),
        ]);
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        // Runs the suite with other flags on every edge (e.g. `--http1-relay=false`,
        // whose answers must be the relay's: docs/testing.md). A flag the test gives
        // itself wins: that test is about it.
        if let Ok(more) = std::env::var("AETHER_TEST_EDGE_ARGS") {
            let name = |f: &str| f.split('=').next().unwrap_or(f).to_owned();
            for flag in more.split_whitespace() {
                if !args.iter().any(|a| name(a) == name(flag)) {
                    args.push(flag.to_owned());
                }
            }
        }
        let mut proc = self.spawn(label, &args)?;
        self.wait_ready(&mut proc).await?;
        Ok(proc)
    }

    /// Waits for admin `/readyz` to be 200.
    pub async fn wait_ready(&self, proc: &mut Proc) -> TestResult {
        let net = self.net;
        eventually("edge admin /readyz is 200", EVENTUALLY, || {
            let alive = proc.check_alive();
            async move {
                alive?;
                let r = admin_get(net, "/readyz").await?;
                ensure!(
                    r.status == StatusCode::OK,
                    "admin /readyz answered {}: {}",
                    r.status,
                    r.text()
                );
                Ok(())
            }
        })
        .await
    }

    /// Waits until the data-plane listener at `addr` answers `/aether/readyz` 200.
    pub async fn wait_listener(&self, addr: SocketAddr) -> TestResult {
        let client = self.net.client_ip();
        eventually(
            &format!("listener {addr} /aether/readyz is 200"),
            EVENTUALLY,
            || async move {
                let r = h1_get_from(client, addr, "readyz.test", "/aether/readyz").await?;
                ensure!(
                    r.status == StatusCode::OK,
                    "listener /aether/readyz answered {}",
                    r.status
                );
                Ok(())
            },
        )
        .await
    }

    pub async fn h1(&self, addr: SocketAddr, host: &str, path: &str) -> Result<Resp, BoxError> {
        h1_get_from(self.net.client_ip(), addr, host, path).await
    }

    pub async fn h2(&self, addr: SocketAddr, host: &str, path: &str) -> Result<Resp, BoxError> {
        h2_get_from(self.net.client_ip(), addr, host, path).await
    }

    pub async fn status(&self) -> Result<Value, BoxError> {
        status_json(self.net).await
    }
}

mod envoy;
mod l4;
mod manifests;
mod mesh;
mod tls_backend;

pub use aether_test_support::tls::*;
pub use l4::*;
pub use manifests::*;
pub use mesh::*;
pub use tls_backend::*;
