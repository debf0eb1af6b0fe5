//! TLSRoute passthrough: the ClientHello is read (not answered) to learn the SNI, the
//! route for that name picks the backend, and everything the client sent, hello
//! included, is forwarded untouched. The backend terminates TLS with its own
//! certificate.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use super::sni::{self, Hello};
use super::{L4Routes, Record, refused, tcp};
use crate::drain::Signal;

/// A client that has not sent its whole ClientHello by then is dropped.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Room for the largest hello plus its record headers.
const MAX_BUFFER: usize = sni::MAX_HELLO + 16 * 5 + 4096;

/// Routes one connection by its SNI and forwards it.
pub async fn serve(
    mut client: TcpStream,
    peer: SocketAddr,
    routes: &L4Routes,
    force_close: &Signal,
    record: &mut Record,
) {
    let Some((name, hello)) = read_hello(&mut client, peer, record).await else {
        return;
    };
    forward(
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

/// Reads the client's ClientHello without answering it: its server name (`None`: it
/// sent none) and every byte read. `None` when there is no usable hello (counted).
pub(super) async fn read_hello(
    client: &mut TcpStream,
    peer: SocketAddr,
    record: &mut Record,
) -> Option<(Option<String>, Vec<u8>)> {
    let mut buf = Vec::with_capacity(4096);
    let read = tokio::time::timeout(HELLO_TIMEOUT, async {
        loop {
            match sni::parse(&buf) {
                Hello::NeedMore => {}
                done => return Ok::<_, std::io::Error>(done),
            }
            if buf.len() >= MAX_BUFFER {
                return Ok(Hello::Invalid("ClientHello too large"));
            }
            buf.reserve(4096);
            if client.read_buf(&mut buf).await? == 0 {
                return Ok(Hello::Invalid("connection closed before the ClientHello"));
            }
        }
    })
    .await;
    let name = match read {
        Ok(Ok(Hello::ServerName(n))) => Some(n),
        Ok(Ok(Hello::NoServerName)) => None,
        Ok(Ok(Hello::Invalid(why))) => {
            tracing::debug!(%peer, why, "not a usable ClientHello");
            refused(record, "bad_client_hello");
            return None;
        }
        Ok(Ok(Hello::NeedMore)) | Ok(Err(_)) => {
            refused(record, "bad_client_hello");
            return None;
        }
        Err(_) => {
            tracing::debug!(%peer, "ClientHello timed out");
            refused(record, "client_hello_timeout");
            return None;
        }
    };
    super::note(record, |r| r.set_sni(name.as_deref()));
    Some((name, buf))
}

/// Forwards a connection whose hello (`hello`, already read) named `name`.
pub(super) async fn forward(
    client: TcpStream,
    peer: SocketAddr,
    routes: &L4Routes,
    name: Option<&str>,
    hello: &[u8],
    force_close: &Signal,
    record: &mut Record,
) {
    let Some(target) = routes.lookup(name) else {
        tracing::debug!(%peer, sni = ?name, "no TLSRoute for this server name");
        refused(record, "no_route");
        return;
    };
    tcp::forward(client, peer, target, hello, force_close, record).await;
}
