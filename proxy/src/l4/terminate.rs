//! TLSRoute in Terminate mode: the edge completes the handshake with the listener's
//! certificate for the client's SNI, then forwards the decrypted stream to the
//! TLSRoute backends for that name, byte for byte (no HTTP is parsed).

use std::net::SocketAddr;

use super::passthrough::HELLO_TIMEOUT;
use super::tcp::ClientStream;
use super::{L4Routes, Record, note, refused, tcp};
use crate::drain::Signal;
use crate::telemetry;
use crate::tls::Handshakes;

pub async fn serve<S: ClientStream>(
    client: S,
    peer: SocketAddr,
    routes: &L4Routes,
    tls: &Handshakes,
    force_close: &Signal,
    record: &mut Record,
) {
    let stream = match tokio::time::timeout(HELLO_TIMEOUT, tls.accept(client, false)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            metrics::counter!(telemetry::TLS_HANDSHAKE_ERRORS_TOTAL).increment(1);
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            note(record, |r| r.refused("tls_handshake_failed"));
            return;
        }
        Err(_) => {
            metrics::counter!(telemetry::TLS_HANDSHAKE_ERRORS_TOTAL).increment(1);
            tracing::debug!(%peer, "TLS handshake timed out");
            note(record, |r| r.refused("tls_handshake_timeout"));
            return;
        }
    };
    let name = stream.get_ref().1.server_name().map(str::to_owned);
    note(record, |r| r.set_sni(name.as_deref()));
    let Some(target) = routes.lookup(name.as_deref()) else {
        tracing::debug!(%peer, sni = ?name, "no TLSRoute for this server name");
        refused(record, "no_route");
        return;
    };
    tcp::forward_terminated(stream, peer, target, force_close, record).await;
}
