//! The certificates a case asks for (`certificates` in `case.yaml`), made when the case
//! starts as the suite makes its own, and requests over TLS with them.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use super::*;

/// The CAs and client certificates of one case.
pub(super) struct Pki {
    cas: BTreeMap<String, TestCa>,
    clients: BTreeMap<String, Leaf>,
    /// The certificate each TLS backend (by `namespace/name`) serves, and the PEM of
    /// the CA it requires client certificates from, if any.
    pub(super) backends: BTreeMap<String, (Leaf, Option<String>)>,
}

impl Pki {
    /// Makes every certificate `c` names; returns them and the manifests (ConfigMaps
    /// with the CAs, Secrets with the server certificates) the edge must read.
    pub(super) fn make(c: &Certificates) -> Result<(Self, String), BoxError> {
        let mut cas = BTreeMap::new();
        let mut yaml = String::new();
        for name in &c.cas {
            let ca = TestCa::new(name)?;
            let (ns, cm) = split_ref(name);
            yaml.push_str(&ca_config_map(ns, cm, &ca));
            cas.insert(name.clone(), ca);
        }
        let ca_named = |name: &str| {
            cas.get(name)
                .ok_or_else(|| err(format!("certificates: no CA {name} among `cas`")))
        };
        let mut backends = BTreeMap::new();
        for s in &c.servers {
            let hosts: Vec<&str> = s.hosts.iter().map(String::as_str).collect();
            let leaf = ca_named(&s.ca)?.leaf(&hosts)?;
            let (ns, name) = split_ref(&s.secret);
            yaml.push_str(&tls_secret(ns, name, &leaf));
            let client_ca = match &s.client_ca {
                Some(name) => Some(ca_named(name)?.cert_pem.clone()),
                None => None,
            };
            for b in &s.backends {
                backends.insert(b.clone(), (leaf.clone(), client_ca.clone()));
            }
        }
        let mut clients = BTreeMap::new();
        for cl in &c.clients {
            clients.insert(cl.name.clone(), ca_named(&cl.ca)?.client_leaf(&cl.name)?);
        }
        Ok((
            Self {
                cas,
                clients,
                backends,
            },
            yaml,
        ))
    }

    /// The PEM certificate of CA `name` (`namespace/name` of its ConfigMap).
    pub(super) fn ca_pem(&self, name: &str) -> Option<&str> {
        self.cas.get(name).map(|ca| ca.cert_pem.as_str())
    }

    /// A TLS session to `addr` as `tls` says (trust, client certificate, SNI defaulting
    /// to `host`, ALPN `h2` or `http/1.1`).
    pub(super) async fn connect(
        &self,
        net: Net,
        addr: SocketAddr,
        host: &str,
        tls: &TlsRequest,
    ) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, BoxError> {
        let ca = self
            .cas
            .get(&tls.trust)
            .ok_or_else(|| err(format!("tls.trust: no CA {}", tls.trust)))?;
        let client = match &tls.client {
            Some(name) => Some(
                self.clients
                    .get(name)
                    .ok_or_else(|| err(format!("tls.client: no client certificate {name}")))?,
            ),
            None => None,
        };
        let alpn: &[u8] = if tls.http2 { b"h2" } else { b"http/1.1" };
        let config = client_config(&ca.cert_der, &[alpn], client)?;
        let sni = tls.sni.as_deref().unwrap_or(host);
        let stream = tls_connect_with(net.client_ip(), addr, sni, &config).await?;
        if tls.http2 {
            let chosen = stream.get_ref().1.alpn_protocol();
            ensure!(
                chosen == Some(b"h2"),
                "the edge chose ALPN {chosen:?}, not h2"
            );
        }
        Ok(stream)
    }
}
