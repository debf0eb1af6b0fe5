//! Forwarding one accepted TCP connection to a backend endpoint, byte for byte.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{L4Target, Record, note, refused};
use crate::backend::Pick;
use crate::drain::Signal;

/// How long a backend may take to accept the connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects `client` to an endpoint of `target` and copies bytes both ways until both
/// directions are closed. `first` holds bytes already read from the client (a peeked
/// ClientHello) and is sent ahead of the rest. Half-close is passed on: when one side
/// stops sending, the other side's write half is shut down and the opposite direction
/// keeps flowing. A connection that can't be forwarded (no endpoint, connect failure)
/// is reset, so the client sees a failure rather than an empty answer.
pub async fn forward<S: ClientStream>(
    client: S,
    peer: SocketAddr,
    target: &Arc<L4Target>,
    first: &[u8],
    force_close: &Signal,
    record: &mut Record,
) {
    forward_with(client, peer, target, first, force_close, false, record).await;
}

/// Like [`forward`], for a stream the edge terminated (TLSRoute Terminate): a backend
/// with a BackendTLSPolicy is reached over TLS as the policy says, as the spec asks for
/// TLSRoute with termination. (Passthrough and TCPRoute bytes are forwarded as they
/// are: a passthrough stream is already the client's TLS.)
pub async fn forward_terminated<S: ClientStream>(
    client: S,
    peer: SocketAddr,
    target: &Arc<L4Target>,
    force_close: &Signal,
    record: &mut Record,
) {
    forward_with(client, peer, target, &[], force_close, true, record).await;
}

async fn forward_with<S: ClientStream>(
    client: S,
    peer: SocketAddr,
    target: &Arc<L4Target>,
    first: &[u8],
    force_close: &Signal,
    originate_tls: bool,
    record: &mut Record,
) {
    note(record, |r| r.set_target(target));
    let (backend, endpoint) = match target.backends.pick() {
        Pick::Endpoint(_, b, ep) => (b, ep.addr),
        Pick::NoEndpoints(b) => {
            tracing::debug!(%peer, backend = %b.name, "no ready endpoint");
            refused(record, "no_endpoints");
            return reset(client);
        }
        Pick::Invalid => {
            tracing::debug!(%peer, route = %target.route, "backendRef invalid");
            refused(record, "invalid_backend");
            return reset(client);
        }
    };
    note(record, |r| r.set_upstream(endpoint));
    let upstream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(endpoint)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(%peer, %endpoint, error = %e, "upstream connect failed");
            backend.stats.connect_error();
            refused(record, "connect_failed");
            return reset(client);
        }
        Err(_) => {
            tracing::debug!(%peer, %endpoint, "upstream connect timed out");
            backend.stats.connect_error();
            refused(record, "connect_timeout");
            return reset(client);
        }
    };
    if let Err(e) = upstream.set_nodelay(true) {
        tracing::debug!(error = %e, "set_nodelay failed");
    }
    let Some(tls) = backend.tls.as_ref().filter(|_| originate_tls) else {
        return pump(
            client,
            upstream,
            (peer, endpoint),
            target,
            first,
            force_close,
            record,
        )
        .await;
    };
    let handshake = async {
        let client = target.backend_client_cert.as_deref();
        let dialer = crate::upstream::tls::dialer(tls, client).map_err(|e| e.to_string())?;
        let dial = crate::upstream::tls::dial(tls, &dialer, backend).map_err(|e| e.to_string())?;
        tokio::time::timeout(CONNECT_TIMEOUT, dial.handshake(upstream))
            .await
            .map_err(|_| "TLS handshake timed out".to_owned())?
            .map_err(|e| e.to_string())
    };
    match handshake.await {
        Ok(upstream) => {
            pump(
                client,
                upstream,
                (peer, endpoint),
                target,
                first,
                force_close,
                record,
            )
            .await;
        }
        Err(e) => {
            tracing::debug!(%peer, %endpoint, error = %e, "upstream TLS failed");
            backend.stats.connect_error();
            refused(record, "upstream_tls");
            reset(client);
        }
    }
}

/// Copies bytes both ways between the client and a connected upstream.
async fn pump<S: ClientStream, U: AsyncRead + AsyncWrite + Unpin>(
    mut client: S,
    mut upstream: U,
    (peer, endpoint): (SocketAddr, SocketAddr),
    target: &L4Target,
    first: &[u8],
    force_close: &Signal,
    record: &mut Record,
) {
    target.stats.connections.increment(1);
    if !first.is_empty() {
        if let Err(e) = upstream.write_all(first).await {
            tracing::debug!(%peer, %endpoint, error = %e, "upstream write failed");
            note(record, |r| r.refused("upstream_write_failed"));
            return reset(client);
        }
        target.stats.bytes_in.increment(first.len() as u64);
        note(record, |r| r.add_bytes(first.len() as u64, 0));
    }
    tokio::select! {
        r = tokio::io::copy_bidirectional(&mut client, &mut upstream) => match r {
            Ok((sent, received)) => {
                target.stats.bytes_in.increment(sent);
                target.stats.bytes_out.increment(received);
                note(record, |r| r.add_bytes(sent, received));
                tracing::debug!(%peer, %endpoint, sent, received, "TCP connection closed");
            }
            Err(e) => {
                // copy_bidirectional does not say how much went through before.
                note(record, |r| r.refused("stream_error"));
                tracing::debug!(%peer, %endpoint, error = %e, "TCP connection failed");
            }
        },
        () = force_close.fired() => {
            note(record, |r| r.refused("drain_deadline"));
            tracing::debug!(%peer, "TCP connection closed at drain deadline");
        }
    }
}

/// A client connection: plain TCP, or TLS the edge terminated over it.
pub trait ClientStream: AsyncRead + AsyncWrite + Unpin {
    fn tcp(&self) -> &TcpStream;
}

impl ClientStream for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl<S: ClientStream> ClientStream for tokio_rustls::server::TlsStream<S> {
    fn tcp(&self) -> &TcpStream {
        self.get_ref().0.tcp()
    }
}

/// Closes with RST: linger 0 makes the kernel drop the connection instead of a FIN.
fn reset<S: ClientStream>(client: S) {
    if let Err(e) = socket2::SockRef::from(client.tcp()).set_linger(Some(Duration::ZERO)) {
        tracing::debug!(error = %e, "set_linger failed");
    }
    drop(client);
}
