//! TLSRoute mixed mode: a port with Terminate and Passthrough TLS listeners. The
//! ClientHello is read (not answered) as for passthrough; the listener owning its
//! server name decides: passthrough forwards everything read so far untouched, and
//! terminate replays the hello into the edge's own handshake.

use std::net::SocketAddr;

use tokio::net::TcpStream;

use super::rewind::Rewind;
use super::{L4Routes, Mode, Record, note, passthrough, refused, terminate};
use crate::drain::Signal;
use crate::tls::Handshakes;

pub async fn serve(
    mut client: TcpStream,
    peer: SocketAddr,
    routes: &L4Routes,
    tls: &Handshakes,
    force_close: &Signal,
    record: &mut Record,
) {
    let Some((name, hello)) = passthrough::read_hello(&mut client, peer, record).await else {
        return;
    };
    match routes.mode(name.as_deref()) {
        Some(Mode::Passthrough) => {
            note(record, |r| r.set_protocol("tls-passthrough"));
            passthrough::forward(
                client,
                peer,
                routes,
                name.as_deref(),
                &hello,
                force_close,
                record,
            )
            .await;
        }
        Some(Mode::Terminate(terminated)) => {
            note(record, |r| r.set_protocol("tls-terminate"));
            let client = Rewind::new(hello, client);
            terminate::serve(client, peer, terminated, tls, force_close, record).await;
        }
        None => {
            tracing::debug!(%peer, sni = ?name, "no TLS listener for this server name");
            refused(record, "no_route");
        }
    }
}
