//! A real kube-apiserver on loopback, backed by etcd, for the Kubernetes-mode tests:
//! built once by `tests/k8s/build.sh`, started per test with its own ports, certs and
//! data, with the official Gateway API CRDs installed. Killed on drop.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

pub use aether_test_support::BoxError;
use aether_test_support::{Proc, free_port, repo_root, required_tool, test_tool};

const TOKEN: &str = "aether-test-token";
/// A second, unprivileged user: no groups but `system:authenticated`, so it may do only
/// what a test binds it to (the API server runs with RBAC).
pub const USER: &str = "edge";
const USER_TOKEN: &str = "aether-test-edge-token";

pub struct Cluster {
    /// Held for the cluster's life: see [`CLUSTERS_AT_ONCE`].
    _slot: ClusterSlot,
    pub dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
    /// A kubeconfig for [`USER`].
    pub user_kubeconfig: PathBuf,
    /// etcd, then the apiserver.
    procs: Vec<Proc>,
    /// How the apiserver was started, to start it again.
    apiserver: (PathBuf, Vec<String>),
    /// Set by [`Cluster::pass`]: until then, the processes started for the test
    /// ([`Cluster::proc`]) print their logs when they go.
    passed: Arc<AtomicBool>,
}

/// Clusters running at once. Each test starts its own etcd and apiserver (plus edges);
/// ten of them at once on a 2-core machine starved each other past every timeout, so
/// the rest wait for a slot. Tests stay independent, and the suite's time grows less
/// than the waiting suggests, since fewer apiservers compete for the CPU.
const CLUSTERS_AT_ONCE: usize = 3;

static RUNNING: std::sync::Mutex<usize> = std::sync::Mutex::new(0);
static FREED: std::sync::Condvar = std::sync::Condvar::new();

struct ClusterSlot;

impl ClusterSlot {
    /// Blocks until fewer than [`CLUSTERS_AT_ONCE`] clusters run.
    fn take() -> Self {
        let mut running = RUNNING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while *running >= CLUSTERS_AT_ONCE {
            running = FREED
                .wait(running)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        *running += 1;
        ClusterSlot
    }
}

impl Drop for ClusterSlot {
    fn drop(&mut self) {
        let mut running = RUNNING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *running = running.saturating_sub(1);
        FREED.notify_one();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Killed before the fields go: the slot, and the directory they write to.
        self.procs.clear();
    }
}

/// The apiserver binary, or None (with the reason printed) when there is no Go
/// toolchain to build it.
fn apiserver_binary() -> Result<Option<PathBuf>, BoxError> {
    from_script("tests/k8s/build.sh", "kube-apiserver")
}

/// Where the official Gateway API CRDs are (`config/crd/{standard,experimental}`
/// inside), from the `sigs.k8s.io/gateway-api` Go module, or None (with the reason
/// printed) when there is no Go toolchain to fetch them. Asked once per test binary.
pub fn crds_dir() -> Result<Option<PathBuf>, BoxError> {
    static DIR: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    if let Some(dir) = DIR.get() {
        return Ok(dir.clone());
    }
    let dir = from_script("tests/k8s/crds.sh", "Gateway API CRDs")?;
    Ok(DIR.get_or_init(|| dir).clone())
}

/// The Prometheus Operator's PodMonitor and ServiceMonitor CRD files (the chart renders
/// those kinds when asked), or None when there is no Go toolchain to fetch them.
pub fn monitoring_crd_files() -> Result<Option<Vec<PathBuf>>, BoxError> {
    let Some(dir) = from_script("tests/k8s/monitoring-crds.sh", "Prometheus Operator CRDs")? else {
        return Ok(None);
    };
    Ok(Some(
        ["podmonitors", "servicemonitors"]
            .iter()
            .map(|kind| dir.join(format!("monitoring.coreos.com_{kind}.yaml")))
            .collect(),
    ))
}

/// Runs one of tests/k8s/'s scripts, which print a path, or exit 3 when there is no
/// Go toolchain to make what they provide.
fn from_script(script: &str, what: &str) -> Result<Option<PathBuf>, BoxError> {
    test_tool(
        script,
        &format!("no Go toolchain, so no {what} to test against"),
    )
}

/// The Gateway API CRDs a test cluster starts with.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Crds {
    /// The standard channel with the chart's GEP-5093 patch.
    Patched,
    /// The standard channel as published.
    Stock,
    None,
}

impl Cluster {
    /// Starts etcd and the apiserver, waits until it serves, installs the CRDs with
    /// the chart's GEP-5093 patch.
    pub async fn start() -> Result<Option<Self>, BoxError> {
        Self::start_with(Crds::Patched).await
    }

    /// Like [`Cluster::start`], with the CRDs exactly as published (no routability).
    pub async fn start_stock_crds() -> Result<Option<Self>, BoxError> {
        Self::start_with(Crds::Stock).await
    }

    /// Like [`Cluster::start`], with no Gateway API CRDs: for tests that install them
    /// the way a user does.
    pub async fn start_without_crds() -> Result<Option<Self>, BoxError> {
        Self::start_with(Crds::None).await
    }

    async fn start_with(crds_wanted: Crds) -> Result<Option<Self>, BoxError> {
        let Some(apiserver) = tokio::task::spawn_blocking(apiserver_binary).await?? else {
            return Ok(None);
        };
        let Some(crds) = tokio::task::spawn_blocking(crds_dir).await?? else {
            return Ok(None);
        };
        let slot = tokio::task::spawn_blocking(ClusterSlot::take).await?;
        let dir = tempfile::tempdir()?;
        let d = dir.path();
        // Certificates: a CA, a serving cert for 127.0.0.1, a service-account key.
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate()?;
        let cert = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?
            .signed_by(&key, &issuer)?;
        std::fs::write(d.join("ca.crt"), ca_cert.pem())?;
        std::fs::write(d.join("serving.crt"), cert.pem())?;
        std::fs::write(d.join("serving.key"), key.serialize_pem())?;
        let sa = KeyPair::generate()?;
        std::fs::write(d.join("sa.key"), sa.serialize_pem())?;
        std::fs::write(d.join("sa.pub"), sa.public_key_pem())?;
        std::fs::write(
            d.join("tokens.csv"),
            format!("{TOKEN},admin,admin,\"system:masters\"\n{USER_TOKEN},{USER},{USER}\n"),
        )?;

        // An audit log of every write USER makes: what the server saw, for tests that
        // count a restricted edge's attempts (forbidden ones included). Nothing else
        // is logged, so the other tests pay nothing for it.
        std::fs::write(
            d.join("audit-policy.yaml"),
            format!(
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n  users: [{USER}]\n  verbs: [create, update, patch, delete]\n- level: None\n"
            ),
        )?;
        let (client_port, peer_port, secure_port) = (free_port(), free_port(), free_port());
        let mut procs = Vec::new();
        let mut etcd = Command::new("etcd");
        etcd.args([
            &format!("--data-dir={}", d.join("etcd").display()),
            &format!("--listen-client-urls=http://127.0.0.1:{client_port}"),
            &format!("--advertise-client-urls=http://127.0.0.1:{client_port}"),
            &format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
            &format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
            &format!("--initial-cluster=default=http://127.0.0.1:{peer_port}"),
            "--unsafe-no-fsync=true",
        ]);
        procs.push(Proc::spawn(etcd, "etcd", d)?.silent());
        let file = |n: &str| d.join(n).display().to_string();
        let apiserver_args: Vec<String> = vec![
            format!("--etcd-servers=http://127.0.0.1:{client_port}"),
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            format!("--secure-port={secure_port}"),
            format!("--tls-cert-file={}", file("serving.crt")),
            format!("--tls-private-key-file={}", file("serving.key")),
            format!("--cert-dir={}", file("certs")),
            // RBAC, as a cluster runs: the admin (system:masters) may do anything, and
            // tests bind USER to exactly what they mean to allow.
            "--authorization-mode=RBAC".to_owned(),
            format!("--token-auth-file={}", file("tokens.csv")),
            "--service-account-issuer=https://kubernetes.default.svc".to_owned(),
            format!("--service-account-key-file={}", file("sa.pub")),
            format!("--service-account-signing-key-file={}", file("sa.key")),
            "--service-cluster-ip-range=10.96.0.0/16".to_owned(),
            "--enable-priority-and-fairness=false".to_owned(),
            format!("--audit-policy-file={}", file("audit-policy.yaml")),
            format!("--audit-log-path={}", file("audit.log")),
        ];
        let mut cmd = Command::new(&apiserver);
        cmd.args(&apiserver_args);
        procs.push(Proc::spawn(cmd, "apiserver", d)?.silent());
        let kubeconfig_of = |name: &str, user: &str, token: &str| -> Result<PathBuf, BoxError> {
            let path = d.join(name);
            std::fs::write(
                &path,
                format!(
                    "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: https://127.0.0.1:{secure_port}\n    certificate-authority: {}\nusers:\n- name: {user}\n  user:\n    token: {token}\ncontexts:\n- name: test\n  context: {{cluster: test, user: {user}}}\ncurrent-context: test\n",
                    file("ca.crt")
                ),
            )?;
            Ok(path)
        };
        let kubeconfig = kubeconfig_of("kubeconfig", "admin", TOKEN)?;
        let user_kubeconfig = kubeconfig_of("kubeconfig-user", USER, USER_TOKEN)?;
        let cluster = Self {
            _slot: slot,
            dir,
            kubeconfig,
            user_kubeconfig,
            procs,
            apiserver: (apiserver.clone(), apiserver_args),
            passed: Arc::new(AtomicBool::new(false)),
        };
        let client = cluster.client().await?;
        cluster.wait_ready(&client).await?;
        if crds_wanted != Crds::None {
            cluster.install_crds(&client, &crds).await?;
        }
        if crds_wanted == Crds::Patched {
            cluster.patch_routability()?;
        }
        Ok(Some(cluster))
    }

    /// Stops the apiserver (etcd keeps the data), waits `down`, starts it again and
    /// waits until it serves: what clients see when the control plane restarts.
    pub async fn restart_apiserver(&mut self, down: std::time::Duration) -> Result<(), BoxError> {
        if let Some(p) = self.procs.get_mut(1) {
            p.kill()?;
        }
        tokio::time::sleep(down).await;
        let (bin, args) = &self.apiserver;
        let mut cmd = Command::new(bin);
        cmd.args(args);
        let restarted = Proc::spawn(cmd, "apiserver-restarted", self.dir.path())?.silent();
        if let Some(slot) = self.procs.get_mut(1) {
            *slot = restarted;
        }
        let client = self.client().await?;
        self.wait_ready(&client).await
    }

    /// Starts `cmd` for this test: its logs are `<label>.log` and `<label>.stdout.log`
    /// in the cluster's directory, printed when it goes unless the test passed.
    pub fn proc(&self, cmd: Command, label: &str) -> Result<Proc, BoxError> {
        Ok(Proc::spawn(cmd, label, self.dir.path())?.until_passed(&self.passed))
    }

    /// Marks the test as passed; call as the last expression of the test.
    pub fn pass(&self) -> Result<(), BoxError> {
        self.passed.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// The writes [`USER`] made, as the server's audit log recorded them (one JSON
    /// event each: `verb`, `objectRef`, `responseStatus.code`, ...).
    pub fn user_writes(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.path().join("audit.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    pub async fn client(&self) -> Result<Client, BoxError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let kc = Kubeconfig::read_from(&self.kubeconfig)?;
        let config =
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
        Ok(Client::try_from(config)?)
    }

    /// The last lines of the (current) apiserver's log.
    fn log_tail(&self) -> String {
        let text = self.procs.get(1).map(Proc::log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    async fn wait_ready(&self, client: &Client) -> Result<(), BoxError> {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            // The `default` namespace exists once the bootstrap controllers have run.
            match Api::<Namespace>::all(client.clone()).get("default").await {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    return Err(format!("apiserver not ready: {e}\n{}", self.log_tail()).into());
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
            }
        }
    }

    /// The chart's GEP-5093 patch to the Gateway CRD, applied with a real kubectl the
    /// way docs/kubernetes.md tells users to.
    pub fn patch_routability(&self) -> Result<(), BoxError> {
        let root = repo_root();
        // tests/chart/tools.sh installs kubectl beside the Helm it prints.
        required_tool("tests/chart/tools.sh")?;
        let out = Command::new(root.join("target/tools/kubectl/kubectl"))
            .args([
                "patch",
                "crd",
                "gateways.gateway.networking.k8s.io",
                "--type=json",
            ])
            .arg("--patch-file")
            .arg(root.join("charts/aether-edge/crd-patches/gateway-routability.yaml"))
            .env("KUBECONFIG", &self.kubeconfig)
            .output()?;
        if !out.status.success() {
            return Err(format!(
                "kubectl patch crd: {}",
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        Ok(())
    }

    /// The official standard-channel CRDs (see [`crds_dir`]).
    async fn install_crds(&self, client: &Client, crds: &Path) -> Result<(), BoxError> {
        let crds = crds.join("config/crd/standard");
        let files: Vec<PathBuf> = [
            "gatewayclasses",
            "gateways",
            "httproutes",
            "referencegrants",
            "grpcroutes",
            "tcproutes",
            "tlsroutes",
            "listenersets",
            "backendtlspolicies",
            // udproutes is left out on purpose: a kind whose CRD is missing must not
            // hold up the others (every test here would time out if it did).
        ]
        .iter()
        .map(|kind| crds.join(format!("gateway.networking.k8s.io_{kind}.yaml")))
        .collect();
        install_crd_files(client, &files).await
    }
}

/// Applies CRD manifests and waits until the server establishes each.
pub async fn install_crd_files(client: &Client, files: &[PathBuf]) -> Result<(), BoxError> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let mut names = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let crd: CustomResourceDefinition = serde_saphyr::from_str(&text)?;
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(
            &name,
            &PatchParams::apply("aether-test").force(),
            &Patch::Apply(&crd),
        )
        .await?;
        names.push(name);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for name in names {
        loop {
            let crd = api.get(&name).await?;
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("CRD {name} not established").into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}
