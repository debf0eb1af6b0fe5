//! Reads the server name (SNI) from the start of a TLS connection without terminating
//! it, for TLSRoute passthrough.
//!
//! Written here rather than taken from a TLS library: rustls's `Acceptor` would hand us
//! the ClientHello but consumes the bytes we must replay to the backend, and this
//! needs only a bounded walk over a few length-prefixed fields (RFC 8446 §4.1.2, RFC
//! 6066 §3). It never allocates for the common single-record hello, never panics on any
//! input (fuzzed: `fuzz/fuzz_targets/sni.rs`), and says `NeedMore` until the whole
//! ClientHello has arrived, however the client split it into records.

use std::borrow::Cow;

/// The largest ClientHello accepted (a post-quantum key share makes hellos of a few
/// KiB; 64 KiB leaves room without letting a client make us buffer more).
pub const MAX_HELLO: usize = 64 * 1024;
/// TLS records carry at most 2^14 bytes of plaintext (a ClientHello is plaintext).
const MAX_RECORD: usize = 16 * 1024;
/// Real clients send the hello in one or two records; a hello cut into many tiny
/// records would make every re-parse copy them all again.
const MAX_RECORDS: usize = 16;
const HANDSHAKE: u8 = 22;
const CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: u16 = 0;
const HOST_NAME: u8 = 0;

/// What the bytes read so far say.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// The ClientHello is not complete yet: read more.
    NeedMore,
    /// A complete ClientHello naming this server (as sent; callers fold case).
    ServerName(String),
    /// A complete ClientHello without a server name.
    NoServerName,
    /// Not a TLS ClientHello, or a malformed one.
    Invalid(&'static str),
}

/// Parses the ClientHello at the start of `buf` (everything the client sent so far).
pub fn parse(buf: &[u8]) -> Hello {
    let mut body: Cow<'_, [u8]> = Cow::Borrowed(&[]);
    let mut pos = 0usize;
    for _ in 0..MAX_RECORDS {
        let Some(header) = buf.get(pos..pos + 5) else {
            return Hello::NeedMore;
        };
        if header[0] != HANDSHAKE {
            return Hello::Invalid("not a TLS handshake record");
        }
        if header[1] != 3 {
            return Hello::Invalid("not a TLS record version");
        }
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if len == 0 || len > MAX_RECORD {
            return Hello::Invalid("bad TLS record length");
        }
        let Some(fragment) = buf.get(pos + 5..pos + 5 + len) else {
            return Hello::NeedMore;
        };
        pos += 5 + len;
        body = if body.is_empty() {
            Cow::Borrowed(fragment)
        } else {
            // A hello split across records: reassemble (rare; bounded by MAX_HELLO).
            let mut joined = body.into_owned();
            joined.extend_from_slice(fragment);
            Cow::Owned(joined)
        };
        if body.len() < 4 {
            continue;
        }
        if body[0] != CLIENT_HELLO {
            return Hello::Invalid("first handshake message is not a ClientHello");
        }
        let hello_len =
            usize::from(body[1]) << 16 | usize::from(body[2]) << 8 | usize::from(body[3]);
        if hello_len > MAX_HELLO {
            return Hello::Invalid("ClientHello too large");
        }
        if let Some(hello) = body.get(4..4 + hello_len) {
            return client_hello(hello);
        }
    }
    Hello::Invalid("ClientHello spread over too many records")
}

/// A bounds-checked cursor: every read is `None` past the end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.0.len() {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    /// A vector with a `u8` length prefix.
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(usize::from(n))
    }
    /// A vector with a `u16` length prefix.
    fn vec16(&mut self) -> Option<Reader<'a>> {
        let n = self.u16()?;
        self.take(usize::from(n)).map(Reader)
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn client_hello(hello: &[u8]) -> Hello {
    match server_name(&mut Reader(hello)) {
        Some(h) => h,
        None => Hello::Invalid("truncated ClientHello"),
    }
}

fn server_name(r: &mut Reader<'_>) -> Option<Hello> {
    r.take(2)?; // legacy_version
    r.take(32)?; // random
    r.vec8()?; // legacy_session_id
    r.vec16()?; // cipher_suites
    r.vec8()?; // legacy_compression_methods
    if r.is_empty() {
        // SSL 3.0-era hellos may carry no extensions at all.
        return Some(Hello::NoServerName);
    }
    let mut extensions = r.vec16()?;
    while !extensions.is_empty() {
        let ty = extensions.u16()?;
        let mut data = extensions.vec16()?;
        if ty != EXT_SERVER_NAME {
            continue;
        }
        let mut names = data.vec16()?;
        while !names.is_empty() {
            let kind = names.u8()?;
            let n = names.u16()?;
            let name = names.take(usize::from(n))?;
            if kind == HOST_NAME {
                return Some(host_name(name));
            }
        }
        return Some(Hello::NoServerName);
    }
    Some(Hello::NoServerName)
}

/// A DNS name as RFC 6066 allows it: ASCII letters, digits, '-', '.', and '_' (seen
/// in the wild), at most 253 bytes.
fn host_name(name: &[u8]) -> Hello {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    match std::str::from_utf8(name) {
        Ok(s) if ok => Hello::ServerName(s.to_owned()),
        _ => Hello::Invalid("server name is not a DNS name"),
    }
}

#[cfg(test)]
mod tests;
