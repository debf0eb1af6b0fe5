//! Shared harness: processes that die with the test, loopback networks per test,
//! HTTP/1.1 and h2c clients over hyper's connection API, admin helpers and `eventually`.

use std::error::Error;
use std::fs::File;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::Value;

pub type BoxError = Box<dyn Error + Send + Sync>;
pub type TestResult = Result<(), BoxError>;

/// Builds a `BoxError` from a message.
pub fn err(msg: impl Into<String>) -> BoxError {
    msg.into().into()
}

/// Fails the test with a message unless `cond` holds.
macro_rules! ensure {
    ($cond:expr, $($arg:tt)+) => {
        if !($cond as bool) {
            return Err($crate::common::err(format!($($arg)+)));
        }
    };
}

pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);
pub const EVENTUALLY: Duration = Duration::from_secs(10);

/// The echo backends listen on this port (the EndpointSlice port).
pub const ECHO_PORT: u16 = 9000;
/// Every test Gateway listener uses this port unless it says otherwise.
pub const LISTENER_PORT: u16 = 8080;

// ---------------------------------------------------------------------------------------
// Per-test network and environment
// ---------------------------------------------------------------------------------------

/// The loopback network 127.77.k.0/24 owned by test k (127.`b`.k.0/24 in general: the
/// conformance cases use `b` = 78).
#[derive(Debug, Clone, Copy)]
pub struct Net {
    pub b: u8,
    pub k: u8,
}

impl Net {
    pub fn ip(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(127, self.b, self.k, host)
    }
    pub fn ip_str(&self, host: u8) -> String {
        self.ip(host).to_string()
    }
    pub fn addr(&self, host: u8, port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.ip(host)), port)
    }
    pub fn admin(&self) -> SocketAddr {
        self.addr(250, 9901)
    }
    /// Echo backend "a".
    pub fn echo_a(&self) -> SocketAddr {
        self.addr(251, ECHO_PORT)
    }
    /// Echo backend "b".
    pub fn echo_b(&self) -> SocketAddr {
        self.addr(252, ECHO_PORT)
    }
    /// The source address every test client binds, so `x-forwarded-for` is exact.
    pub fn client_ip(&self) -> IpAddr {
        IpAddr::V4(self.ip(100))
    }
    pub fn pool(&self) -> String {
        format!("127.{}.{}.0/28", self.b, self.k)
    }
    /// The explicit Gateway address most tests use.
    pub fn gw(&self) -> SocketAddr {
        self.addr(5, LISTENER_PORT)
    }
}

/// One test's world: a tempdir with the manifests and logs, and a flag that says
/// whether the test reached its end (if not, child logs are printed on drop).
pub struct TestEnv {
    pub net: Net,
    pub dir: tempfile::TempDir,
    passed: Arc<AtomicBool>,
    started: Instant,
}

impl TestEnv {
    pub fn new(k: u8) -> Result<Self, BoxError> {
        Self::on(Net { b: 77, k })
    }

    /// Like `new`, on any 127.b.k.0/24 network.
    pub fn on(net: Net) -> Result<Self, BoxError> {
        let dir = tempfile::Builder::new()
            .prefix(&if net.b == 77 {
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
        let log_path = self.dir.path().join(format!("{label}.log"));
        let stdout_path = self.dir.path().join(format!("{label}.stdout.log"));
        let log = File::create(&log_path)?;
        let out = File::create(&stdout_path)?;
        let rust_log = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_owned());
        let child = Command::new(env!("CARGO_BIN_EXE_aether-edge"))
            .args(args)
            .env("RUST_LOG", rust_log)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(log)
            .spawn()?;
        Ok(Proc {
            child,
            label: label.to_owned(),
            args: args.to_vec(),
            log_path,
            stdout_path,
            passed: Arc::clone(&self.passed),
            reaped: None,
        })
    }

    /// Starts `aether-edge echo` and waits until it answers.
    pub async fn spawn_echo(&self, listen: SocketAddr, name: &str) -> Result<Proc, BoxError> {
        let args = vec![
            "echo".to_owned(),
            "--listen".to_owned(),
            listen.to_string(),
            "--name".to_owned(),
            name.to_owned(),
            "--log".to_owned(),
            self.echo_log(name).display().to_string(),
        ];
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
        let mut proc = self.spawn(label, &args)?;
        let net = self.net;
        eventually("edge admin /readyz is 200", EVENTUALLY, || {
            let alive = proc.check_alive();
            async move {
                alive?;
                let r = admin_get(net, "/readyz").await?;
                ensure!(
                    r.status == StatusCode::OK,
                    "admin /readyz answered {}",
                    r.status
                );
                Ok(())
            }
        })
        .await?;
        Ok(proc)
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

// ---------------------------------------------------------------------------------------
// eventually
// ---------------------------------------------------------------------------------------

/// Polls `f` every 50 ms until it succeeds or `timeout` passes; then returns the last
/// error, prefixed by `what`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> Result<T, BoxError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, BoxError>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) => {
                if Instant::now() >= deadline {
                    return Err(err(format!(
                        "timed out after {timeout:?} waiting for: {what}; last error: {e}"
                    )));
                }
            }
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

// Declared after `ensure!` so the submodules can use it.
mod admin;
mod clients;
mod envoy;
mod l4;
mod mesh;
mod process;
mod tls;
mod tls_backend;

pub use admin::*;
pub use clients::*;
pub use l4::*;
pub use mesh::*;
pub use process::*;
pub use tls::*;
pub use tls_backend::*;

/// A test tool's path from its install script (`tests/<tool>/install.sh` prints it).
/// None, with `missing` printed, when the script exits 3 (the tool cannot be had on
/// this machine), unless CI's AETHER_REQUIRE_K8S=1 requires the test tools.
pub fn test_tool(script: &str, missing: &str) -> Result<Option<PathBuf>, BoxError> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(script);
    let out = Command::new("bash")
        .arg(path)
        .stderr(Stdio::inherit())
        .output()?;
    match out.status.code() {
        Some(0) => Ok(Some(PathBuf::from(String::from_utf8(out.stdout)?.trim()))),
        Some(3) if std::env::var("AETHER_REQUIRE_K8S").is_ok_and(|v| v == "1") => {
            Err(err(format!("{missing}, and AETHER_REQUIRE_K8S=1")))
        }
        Some(3) => {
            eprintln!("SKIPPED: {missing}");
            Ok(None)
        }
        _ => Err(err(format!("{script} failed: {}", out.status))),
    }
}
