//! `aether-edge echo`: answers every request with JSON describing what it received, in
//! the spirit of the Gateway API conformance echo server. A request header
//! `x-echo-delay-ms: N` delays the answer by N ms (capped at 60 s), for drain tests.
//! A request with an `Upgrade` header gets `101 Switching Protocols` with the same
//! token, then every byte sent on the upgraded connection comes back. Queries with a
//! `uuid` drive the retry simulation (`echo_retry`). With `--tls-cert`/`--tls-key` it
//! serves TLS (ALPN h2 or http/1.1) and reports the SNI the client sent; with `--udp` it
//! answers each UDP datagram on the same address with one naming itself.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde::Serialize;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::Mutex;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::cli::EchoArgs;
use crate::echo_retry::{ATTEMPT_HEADER, RetrySim};

#[derive(Serialize)]
struct Echo<'a> {
    name: &'a str,
    method: &'a str,
    path: &'a str,
    host: &'a str,
    protocol: String,
    /// The TLS server name the client asked for (TLS only).
    #[serde(skip_serializing_if = "Option::is_none")]
    sni: Option<&'a str>,
    headers: BTreeMap<&'a str, String>,
}

/// Where each request is recorded, when asked to.
type RequestLog = Option<Arc<Mutex<tokio::fs::File>>>;

pub async fn run(args: EchoArgs) -> anyhow::Result<()> {
    let listener = TcpListener::bind(args.listen).await?;
    let log = match &args.log {
        Some(path) => Some(Arc::new(Mutex::new(
            tokio::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .await?,
        ))),
        None => None,
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(acceptor(cert, key, args.tls_client_ca.as_deref())?),
        _ => None,
    };
    if args.udp {
        let socket = UdpSocket::bind(args.listen).await?;
        tokio::spawn(serve_udp(socket, args.name.clone().into()));
    }
    tracing::info!(addr = %listener.local_addr()?, name = %args.name, tls = tls.is_some(), udp = args.udp, "echo backend listening");
    serve(listener, args.name.into(), log, tls).await;
    Ok(())
}

/// What a UDP datagram gets back.
#[derive(Serialize)]
struct UdpEcho<'a> {
    name: &'a str,
    /// The datagram received, as text (lossy).
    request: &'a str,
}

/// One answer per datagram, to its sender: no state, so every flow the edge opens is
/// answered by whichever echo it reached.
async fn serve_udp(socket: UdpSocket, name: Arc<str>) {
    let mut buf = vec![0u8; 65_535];
    loop {
        let (n, from) = match socket.recv_from(&mut buf).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "echo UDP receive failed");
                continue;
            }
        };
        let request = String::from_utf8_lossy(buf.get(..n).unwrap_or_default());
        let answer = serde_json::to_vec(&UdpEcho {
            name: &name,
            request: &request,
        })
        .unwrap_or_default();
        if let Err(e) = socket.send_to(&answer, from).await {
            tracing::debug!(error = %e, %from, "echo UDP answer failed");
        }
    }
}

/// A TLS acceptor for the PEM chain and key in these files, offering h2 and http/1.1;
/// with `client_ca`, clients must present a certificate from those CAs.
fn acceptor(cert: &Path, key: &Path, client_ca: Option<&Path>) -> anyhow::Result<TlsAcceptor> {
    let chain = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for ca in CertificateDer::pem_file_iter(path)? {
                roots.add(ca?)?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

async fn serve(listener: TcpListener, name: Arc<str>, log: RequestLog, tls: Option<TlsAcceptor>) {
    let builder = auto::Builder::new(TokioExecutor::new());
    let sim = Arc::new(RetrySim::default());
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "echo accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let name = Arc::clone(&name);
        let log = log.clone();
        let sim = Arc::clone(&sim);
        let Some(tls) = &tls else {
            let conn = builder
                .serve_connection_with_upgrades(
                    TokioIo::new(stream),
                    service_fn(move |req| {
                        answer(Arc::clone(&name), log.clone(), Arc::clone(&sim), None, req)
                    }),
                )
                .into_owned();
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "echo connection ended with error");
                }
            });
            continue;
        };
        // The handshake on the connection's own task: a slow client delays no other.
        let (tls, builder) = (tls.clone(), builder.clone());
        tokio::spawn(async move {
            let stream = match tls.accept(stream).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(error = %e, "echo TLS handshake failed");
                    return;
                }
            };
            let sni: Option<Arc<str>> = stream.get_ref().1.server_name().map(Into::into);
            let conn = builder.serve_connection_with_upgrades(
                TokioIo::new(stream),
                service_fn(move |req| {
                    let sni = sni.clone();
                    answer(Arc::clone(&name), log.clone(), Arc::clone(&sim), sni, req)
                }),
            );
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "echo connection ended with error");
            }
        });
    }
}

async fn answer(
    name: Arc<str>,
    log: RequestLog,
    sim: Arc<RetrySim>,
    sni: Option<Arc<str>>,
    mut req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if let Some(proto) = req.headers().get(header::UPGRADE).cloned() {
        let upgraded = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            match upgraded.await {
                Ok(io) => {
                    let (mut rd, mut wr) = tokio::io::split(TokioIo::new(io));
                    if let Err(e) = tokio::io::copy(&mut rd, &mut wr).await {
                        tracing::debug!(error = %e, "echo upgrade stream ended");
                    }
                }
                Err(e) => tracing::debug!(error = %e, "echo upgrade failed"),
            }
        });
        let mut resp = Response::new(Full::new(Bytes::new()));
        *resp.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
        resp.headers_mut().insert(header::UPGRADE, proto);
        resp.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("upgrade"),
        );
        return Ok(resp);
    }
    let verdict = sim.check(req.uri().query());
    let attempt = verdict
        .as_ref()
        .map(|v| header::HeaderValue::from(v.attempt));
    if let Some((status, delay)) = verdict.and_then(|v| v.fail) {
        drain(req.body_mut()).await;
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        let mut resp = Response::new(Full::new(Bytes::from_static(b"simulated failure\n")));
        *resp.status_mut() = status;
        if let Some(a) = attempt {
            resp.headers_mut().insert(ATTEMPT_HEADER, a);
        }
        return Ok(resp);
    }
    // Read what the client sent before answering, like the failure path: answering and
    // closing with request bytes unread would reset the connection under the answer.
    drain(req.body_mut()).await;
    let delay = req
        .headers()
        .get("x-echo-delay-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .map(|ms| Duration::from_millis(ms.min(60_000)));
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    let mut headers: BTreeMap<&str, String> = BTreeMap::new();
    for (k, v) in req.headers() {
        let v = String::from_utf8_lossy(v.as_bytes());
        headers
            .entry(k.as_str())
            .and_modify(|prev| {
                prev.push_str(", ");
                prev.push_str(&v);
            })
            .or_insert_with(|| v.into_owned());
    }
    let host = req
        .uri()
        .authority()
        .map(|a| a.as_str())
        .or_else(|| {
            req.headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
        })
        .unwrap_or("");
    let echo = Echo {
        name: &name,
        method: req.method().as_str(),
        path: req.uri().path_and_query().map_or("/", |p| p.as_str()),
        host,
        protocol: format!("{:?}", req.version()),
        sni: sni.as_deref(),
        headers,
    };
    let body = serde_json::to_vec(&echo).unwrap_or_default();
    if let Some(log) = log {
        let mut line = body.clone();
        line.push(b'\n');
        // tokio's File finishes a write in the background: flush, so a test that reads
        // the log after the answer arrives sees this request in it.
        let mut file = log.lock().await;
        let written = match file.write_all(&line).await {
            Ok(()) => file.flush().await,
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            tracing::warn!(error = %e, "cannot write the request log");
        }
    }
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    if let Some(a) = attempt {
        resp.headers_mut().insert(ATTEMPT_HEADER, a);
    }
    Ok(resp)
}

/// The most of a request body the echo reads before answering.
const DRAIN_LIMIT: usize = 8 << 20;

/// Reads the request body (up to [`DRAIN_LIMIT`]) before answering. A server that
/// answers and closes with request bytes unread makes the kernel send a reset, which
/// can discard the answer before the proxy reads it: the proxy would then see a reset
/// where a status was meant (real servers linger on close for this).
async fn drain(body: &mut Incoming) {
    let mut read = 0;
    while read < DRAIN_LIMIT {
        match body.frame().await {
            Some(Ok(frame)) => read += frame.data_ref().map_or(0, Bytes::len),
            Some(Err(_)) | None => break,
        }
    }
}
