//! Test PKI (rcgen), and TLS clients (tokio-rustls) that report what the server sent.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::manifest::{self, Manifest};
use crate::{BoxError, REQUEST_TIMEOUT, connect_from, err};

/// A throwaway certificate authority.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    pub cert_der: CertificateDer<'static>,
    pub cert_pem: String,
}

/// A server certificate and key, PEM-encoded as a `kubernetes.io/tls` Secret holds them.
#[derive(Clone)]
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert_der: CertificateDer<'static>,
}

impl Leaf {
    /// A TLS acceptor presenting this certificate and offering `alpn` (none: no ALPN).
    pub fn acceptor(&self, alpn: &[&[u8]]) -> Result<tokio_rustls::TlsAcceptor, BoxError> {
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())?;
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![self.cert_der.clone()], key)?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }
}

impl TestCa {
    pub fn new(name: &str) -> Result<Self, BoxError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(Self {
            cert_der: cert.der().clone(),
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    pub fn leaf(&self, names: &[&str]) -> Result<Leaf, BoxError> {
        let params =
            CertificateParams::new(names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())?;
        self.sign(params)
    }

    /// A server certificate for DNS `names` that also carries URI subjectAltName `uri`.
    pub fn leaf_with_uri(&self, names: &[&str], uri: &str) -> Result<Leaf, BoxError> {
        let mut params =
            CertificateParams::new(names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())?;
        params
            .subject_alt_names
            .push(rcgen::SanType::URI(uri.try_into()?));
        self.sign(params)
    }

    /// A client certificate (extended key usage clientAuth) for `name`.
    pub fn client_leaf(&self, name: &str) -> Result<Leaf, BoxError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Result<Leaf, BoxError> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().clone(),
        })
    }
}

/// A `kubernetes.io/tls` Secret manifest holding `leaf`.
pub fn tls_secret(ns: &str, name: &str, leaf: &Leaf) -> String {
    manifest::tls_secret(ns, name, &leaf.cert_pem, &leaf.key_pem).yaml()
}

/// A ConfigMap manifest whose `ca.crt` is `ca`'s certificate: the CA bundle frontend
/// validation and BackendTLSPolicies refer to.
pub fn ca_config_map(ns: &str, name: &str, ca: &TestCa) -> String {
    manifest::ca_config_map(ns, name, &ca.cert_pem).yaml()
}

/// Opens a TLS session from `src` to `dst` asking for `sni`, trusting only `ca`.
/// Returns the stream and the leaf certificate the server presented.
pub async fn tls_connect(
    src: IpAddr,
    dst: SocketAddr,
    sni: &str,
    ca: &TestCa,
    alpn: &[&[u8]],
) -> Result<(TlsStream<TcpStream>, CertificateDer<'static>), BoxError> {
    tls_connect_as(src, dst, sni, ca, alpn, None).await
}

/// Like [`tls_connect`], presenting `client` as the client certificate when given.
pub async fn tls_connect_as(
    src: IpAddr,
    dst: SocketAddr,
    sni: &str,
    ca: &TestCa,
    alpn: &[&[u8]],
    client: Option<&Leaf>,
) -> Result<(TlsStream<TcpStream>, CertificateDer<'static>), BoxError> {
    let config = client_config(&ca.cert_der, alpn, client)?;
    let tls = tls_connect_with(src, dst, sni, &config).await?;
    let presented = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .cloned()
        .ok_or_else(|| err("the server presented no certificate"))?;
    Ok((tls, presented))
}

/// A client trusting only `ca`, offering `alpn`, presenting `client` when given. Its
/// session cache lives in the config: connections made with one config resume.
pub fn client_config(
    ca: &CertificateDer<'static>,
    alpn: &[&[u8]],
    client: Option<&Leaf>,
) -> Result<Arc<rustls::ClientConfig>, BoxError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone())?;
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots);
    let mut config = match client {
        None => builder.with_no_client_auth(),
        Some(leaf) => {
            let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes())?;
            builder.with_client_auth_cert(vec![leaf.cert_der.clone()], key)?
        }
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// A TLS session from `src` to `dst` asking for `sni`, with `config`; bounded in time.
pub async fn tls_connect_with(
    src: IpAddr,
    dst: SocketAddr,
    sni: &str,
    config: &Arc<rustls::ClientConfig>,
) -> Result<TlsStream<TcpStream>, BoxError> {
    let tcp = connect_from(src, dst).await?;
    let name = ServerName::try_from(sni.to_owned())?;
    let tls = tokio::time::timeout(
        REQUEST_TIMEOUT,
        TlsConnector::from(Arc::clone(config)).connect(name, tcp),
    )
    .await??;
    Ok(tls)
}
