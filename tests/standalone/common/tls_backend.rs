//! A TLS HTTP backend inside the test process (tokio-rustls + hyper), for
//! BackendTLSPolicy: it records the SNI, the ALPN protocol, the HTTP version and the
//! client certificate of every request it answers, so tests assert on what the backend
//! really saw. It can require client certificates from one CA (Gateway
//! `spec.tls.backend.clientCertificateRef`), refusing handshakes without one.

use std::sync::Mutex;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rustls::pki_types::pem::PemObject;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::*;

/// What the backend saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    pub sni: Option<String>,
    pub alpn: Option<String>,
    pub version: String,
    pub path: String,
    /// The DER of the certificate the client presented, if any.
    pub client_cert: Option<Vec<u8>>,
}

/// A running TLS backend; stops when dropped.
pub struct TlsBackend {
    pub seen: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
}

impl Drop for TlsBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsBackend {
    /// Serves HTTP/1.1 and HTTP/2 (by ALPN) over TLS with `leaf` at `addr`.
    pub async fn start(addr: SocketAddr, leaf: &Leaf) -> Result<Self, BoxError> {
        Self::serve(addr, leaf.acceptor(&[b"h2", b"http/1.1"])?).await
    }

    /// Like [`TlsBackend::start`], refusing every client without a certificate that
    /// chains to `client_ca` (as the suite's echo-basic with `TLS_CLIENT_CACERTS`).
    pub async fn start_requiring_client(
        addr: SocketAddr,
        leaf: &Leaf,
        client_ca: &TestCa,
    ) -> Result<Self, BoxError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(client_ca.cert_der.clone())?;
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::clone(&provider),
        )
        .build()?;
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes())?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![leaf.cert_der.clone()], key)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Self::serve(addr, tokio_rustls::TlsAcceptor::from(Arc::new(config))).await
    }

    async fn serve(
        addr: SocketAddr,
        acceptor: tokio_rustls::TlsAcceptor,
    ) -> Result<Self, BoxError> {
        let listener = TcpListener::bind(addr).await?;
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let log = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let log = Arc::clone(&log);
                tokio::spawn(async move {
                    // A client that refuses our certificate ends here; that is the point.
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let (_, session) = tls.get_ref();
                    let sni = session.server_name().map(str::to_owned);
                    let alpn = session
                        .alpn_protocol()
                        .map(|p| String::from_utf8_lossy(p).into_owned());
                    let client_cert = session
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .map(|c| c.as_ref().to_vec());
                    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let seen = Seen {
                            sni: sni.clone(),
                            alpn: alpn.clone(),
                            version: format!("{:?}", req.version()),
                            path: req.uri().path().to_owned(),
                            client_cert: client_cert.clone(),
                        };
                        if let Ok(mut l) = log.lock() {
                            l.push(seen);
                        }
                        async {
                            Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                                Bytes::from_static(b"tls-backend"),
                            )))
                        }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Ok(Self { seen, task })
    }

    /// The requests seen so far for `path`.
    pub fn seen_for(&self, path: &str) -> Vec<Seen> {
        self.seen
            .lock()
            .map(|l| l.iter().filter(|s| s.path == path).cloned().collect())
            .unwrap_or_default()
    }
}
