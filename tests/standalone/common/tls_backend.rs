//! A TLS HTTP backend inside the test process (tokio-rustls + hyper), for
//! BackendTLSPolicy: it records the SNI, the ALPN protocol and the HTTP version of every
//! request it answers, so tests assert on what the backend really saw.

use std::sync::Mutex;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
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
        let acceptor = leaf.acceptor(&[b"h2", b"http/1.1"])?;
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
                    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let seen = Seen {
                            sni: sni.clone(),
                            alpn: alpn.clone(),
                            version: format!("{:?}", req.version()),
                            path: req.uri().path().to_owned(),
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
