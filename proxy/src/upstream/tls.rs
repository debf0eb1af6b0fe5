//! TLS origination for backends with a BackendTLSPolicy: the policy's handshake, and
//! the send path that picks the policy's own pools (HTTP/1.1 keep-alive, or one
//! HTTP/2 connection per endpoint). L4 routes (TLSRoute Terminate) dial with it too.

use std::sync::Arc;

use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::h1::H1Pool;
use super::h2pool::H2Pool;
use super::{BoxError, Ready, UpstreamError, UpstreamSettings};
use crate::backend::{Backend, Endpoint};
use crate::backend_client_cert::ClientCertificate;
use crate::backend_tls::{BackendTls, Dialer};

/// What a TLS dial needs: the policy's client config and SNI, and the backend's name
/// for the error counter.
#[derive(Clone)]
pub struct TlsDial {
    pub connector: TlsConnector,
    pub server_name: ServerName<'static>,
    pub backend: Arc<str>,
    pub stats: Arc<crate::series::BackendCounters>,
}

impl TlsDial {
    /// Runs the handshake; a failure (unknown CA, wrong name) is counted and logged.
    pub async fn handshake(&self, tcp: TcpStream) -> Result<TlsStream<TcpStream>, BoxError> {
        self.connector
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|e| {
                self.stats.tls_error();
                tracing::warn!(backend = %self.backend, sni = ?self.server_name, error = %e, "upstream TLS handshake failed");
                e.into()
            })
    }
}

/// The connections of `tls` that present `client` (a Gateway's backend client
/// certificate), or the policy's own when there is none; an invalid certificate makes
/// them fail, as an invalid policy does.
pub(crate) fn dialer<'a>(
    tls: &'a BackendTls,
    client: Option<&ClientCertificate>,
) -> Result<Variant<'a>, UpstreamError> {
    let Some(client) = client else {
        return Ok(Variant::Plain(&tls.plain));
    };
    let Some(key) = &client.key else {
        let why = client.invalid.as_deref().unwrap_or("not usable");
        return Err(UpstreamError::Connect(
            format!("backend client certificate {}: {why}", client.reference).into(),
        ));
    };
    match tls.presenting(key) {
        Some(v) => Ok(Variant::Presenting(v)),
        // The policy itself is invalid: dial() says why.
        None => Ok(Variant::Plain(&tls.plain)),
    }
}

/// A [`Dialer`] of a policy, borrowed or held.
pub(crate) enum Variant<'a> {
    Plain(&'a Dialer),
    Presenting(Arc<Dialer>),
}

impl std::ops::Deref for Variant<'_> {
    type Target = Dialer;
    fn deref(&self) -> &Dialer {
        match self {
            Variant::Plain(d) => d,
            Variant::Presenting(d) => d,
        }
    }
}

/// The policy's TLS dial for `backend` with `dialer`'s configuration, or why its
/// connections must fail.
pub(crate) fn dial(
    tls: &BackendTls,
    dialer: &Dialer,
    backend: &Backend,
) -> Result<TlsDial, UpstreamError> {
    let Some(config) = &dialer.config else {
        let why = tls.invalid.as_deref().unwrap_or("no usable CA certificate");
        return Err(UpstreamError::Connect(
            format!("BackendTLSPolicy {}: {why}", tls.policy).into(),
        ));
    };
    Ok(TlsDial {
        connector: TlsConnector::from(Arc::clone(config)),
        server_name: tls.server_name.clone(),
        backend: Arc::clone(&backend.name),
        stats: Arc::clone(&backend.stats),
    })
}

/// A connection to `endpoint` over the policy's TLS, presenting `client` if given:
/// HTTP/2 when `h2`, else HTTP/1.1 (a new one when `fresh`).
pub(crate) async fn connect(
    settings: &UpstreamSettings,
    (tls, client): (&BackendTls, Option<&ClientCertificate>),
    h2: bool,
    backend: &Backend,
    endpoint: &Endpoint,
    fresh: bool,
) -> Result<Ready, UpstreamError> {
    let dialer = dialer(tls, client)?;
    if h2 {
        let pool = match dialer.h2.get() {
            Some(p) => p,
            None => {
                let dial = dial(tls, &dialer, backend)?;
                dialer
                    .h2
                    .get_or_init(|| H2Pool::new(settings.connect_timeout).with_tls(dial))
            }
        };
        return pool.sender(endpoint.addr).await.map(Ready::H2);
    }
    let pool = match dialer.http1.get() {
        Some(p) => p,
        None => {
            let dial = dial(tls, &dialer, backend)?;
            dialer
                .http1
                .get_or_init(|| H1Pool::new(settings, Some(dial)))
        }
    };
    pool.checkout(endpoint.addr, fresh).await.map(Ready::Http1)
}
