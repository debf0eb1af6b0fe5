//! Mesh-mode helpers: a SPIFFE test PKI (rcgen), a real Envoy as a pod's inbound mTLS
//! listener at pod_ip:15008, and the manifests of a Pod behind an EndpointSlice.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::CertificateDer;

use super::*;

pub const TRUST_DOMAIN: &str = "mesh.test";
pub const MESH_PORT: u16 = 15008;
/// The edge's own identity in every mesh test.
pub const EDGE_ID: &str = "spiffe://mesh.test/ns/edge/sa/aether-edge";

/// The trust domain's CA.
pub struct SpiffeCa {
    issuer: Issuer<'static, KeyPair>,
    pub pem: String,
    pub der: CertificateDer<'static>,
}

/// An X.509-SVID: chain (leaf only) and PKCS#8 key.
#[derive(Clone)]
pub struct Svid {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert_der: CertificateDer<'static>,
    pub key_der: Vec<u8>,
}

impl SpiffeCa {
    pub fn new() -> Result<Self, BoxError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "mesh.test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(Self {
            pem: cert.pem(),
            der: cert.der().clone(),
            issuer: Issuer::new(params, key),
        })
    }

    /// An SVID for `id` whose subject CN is `cn` (Envoy's XFCC shows it, which tells
    /// SVIDs of one ID apart).
    pub fn svid(&self, id: &str, cn: &str) -> Result<Svid, BoxError> {
        self.svid_valid(id, cn, true)
    }

    /// Like `svid`, but valid only in 2020 when `current` is false.
    pub fn svid_valid(&self, id: &str, cn: &str, current: bool) -> Result<Svid, BoxError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        if !current {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2020, 12, 31);
        }
        params.distinguished_name.push(DnType::CommonName, cn);
        params.subject_alt_names = vec![SanType::URI(id.try_into()?)];
        // The spiffe crate refuses a leaf without an explicit CA:FALSE, as SPIRE's are.
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Svid {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().clone(),
            key_der: key.serialize_der(),
        })
    }
}

impl Svid {
    /// The Workload API's form of this SVID, with `ca` as its bundle.
    pub fn wire(&self, id: &str, ca: &SpiffeCa) -> aether_test_workload_api::SvidDer {
        aether_test_workload_api::SvidDer {
            spiffe_id: id.to_owned(),
            chain: self.cert_der.to_vec(),
            key: self.key_der.clone(),
            bundle: ca.der.to_vec(),
        }
    }
}

/// Writes `svid` and the bundle as `<name>.crt`, `<name>.key`, `bundle.pem` in `dir`;
/// returns the three paths.
pub fn write_svid(
    dir: &Path,
    name: &str,
    svid: &Svid,
    ca: &SpiffeCa,
) -> Result<[PathBuf; 3], BoxError> {
    let paths = [
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
        dir.join("bundle.pem"),
    ];
    std::fs::write(&paths[0], &svid.cert_pem)?;
    std::fs::write(&paths[1], &svid.key_pem)?;
    std::fs::write(&paths[2], &ca.pem)?;
    Ok(paths)
}

/// The spiffe ID of service account `sa` in `ns`.
pub fn spiffe_id(ns: &str, sa: &str) -> String {
    format!("spiffe://{TRUST_DOMAIN}/ns/{ns}/sa/{sa}")
}

/// A Pod `name` in `ns` running as service account `sa`.
pub fn pod(ns: &str, name: &str, sa: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  serviceAccountName: {sa}\n  containers:\n  - name: app\n    image: app\n"
    )
}

/// A Service `svc` (port 80 -> named port http) whose EndpointSlice lists `(ip, pod)`
/// endpoints on `port`; a pod name of `None` means no targetRef. `annotations` go on
/// the Service.
pub fn mesh_backend(
    ns: &str,
    svc: &str,
    port: u16,
    endpoints: &[(IpAddr, Option<&str>)],
    annotations: &[(&str, &str)],
) -> String {
    let mut s = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: {svc}\n  namespace: {ns}\n"
    );
    if !annotations.is_empty() {
        s.push_str("  annotations:\n");
        for (k, v) in annotations {
            let _ = writeln!(s, "    {k}: \"{v}\"");
        }
    }
    let _ = write!(
        s,
        "spec:\n  ports:\n  - name: http\n    port: 80\n    targetPort: {port}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {svc}-x1\n  namespace: {ns}\n  labels:\n    kubernetes.io/service-name: {svc}\naddressType: IPv4\nports:\n- name: http\n  port: {port}\nendpoints:\n"
    );
    for (ip, pod) in endpoints {
        let _ = write!(
            s,
            "- addresses: [\"{ip}\"]\n  conditions:\n    ready: true\n"
        );
        if let Some(p) = pod {
            let _ = write!(
                s,
                "  targetRef:\n    kind: Pod\n    name: {p}\n    namespace: {ns}\n"
            );
        }
    }
    s
}

impl TestEnv {
    /// Starts `aether-edge run` in mesh mode with `extra` identity flags, without
    /// waiting for readiness (mesh mode is not ready before it holds an SVID).
    pub fn spawn_mesh_edge(&self, label: &str, extra: &[String]) -> Result<Proc, BoxError> {
        let mut args: Vec<String> = [
            "run",
            "--manifests",
            &self.manifests().display().to_string(),
            "--admin",
            &self.net.admin().to_string(),
            "--address-pool",
            &self.net.pool(),
            "--drain-timeout",
            "5s",
            "--mesh",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        args.extend(extra.iter().cloned());
        self.spawn(label, &args)
    }

    /// Starts the mesh edge with `flags` and waits until it is ready and its
    /// Gateway's listener answers.
    pub async fn spawn_serving_mesh_edge(&self, flags: &[String]) -> Result<Proc, BoxError> {
        let mut edge = self.spawn_mesh_edge("edge", flags)?;
        self.wait_ready(&mut edge).await?;
        self.wait_listener(self.net.gw()).await?;
        Ok(edge)
    }

    /// A pod of service account `default/app` at `ip`: its echo backend `name` on
    /// ECHO_PORT, behind an inbound Envoy that presents the pod's SVID and admits the
    /// edge.
    pub async fn spawn_app_pod(
        &self,
        ip: IpAddr,
        name: &str,
        ca: &SpiffeCa,
    ) -> Result<(Proc, super::envoy::Inbound), BoxError> {
        let echo = self
            .spawn_echo(SocketAddr::new(ip, ECHO_PORT), name)
            .await?;
        let inbound = self
            .spawn_inbound(
                ip,
                &ca.svid(&spiffe_id("default", "app"), name)?,
                ca,
                EDGE_ID,
            )
            .await?;
        Ok((echo, inbound))
    }
}

/// `--mesh-svid-cert/--mesh-svid-key/--mesh-bundle` for the three paths.
pub fn file_flags(paths: &[PathBuf; 3]) -> Vec<String> {
    vec![
        "--mesh-svid-cert".to_owned(),
        paths[0].display().to_string(),
        "--mesh-svid-key".to_owned(),
        paths[1].display().to_string(),
        "--mesh-bundle".to_owned(),
        paths[2].display().to_string(),
    ]
}
