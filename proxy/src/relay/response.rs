//! The upstream's answer head: how its body is framed, whether the connection can
//! carry another request, and the head the client gets.

/// Connection-specific headers never passed to the client, and the request ID the
/// edge sets itself. `Transfer-Encoding` is kept: a chunked body is passed through as
/// it came, chunks and all.
const NOT_COPIED: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
    "x-request-id",
];

/// How the answer's body ends (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    /// `HEAD`, 204, 304: no body whatever the headers say.
    Empty,
    Length(u64),
    Chunked,
    /// Until the upstream closes.
    Close,
}

#[derive(Debug)]
pub(super) struct Answer {
    pub status: u16,
    /// Bytes of the upstream head.
    pub len: usize,
    pub framing: Framing,
    /// The upstream connection may carry another request once this body is read.
    pub reusable: bool,
}

/// Why an answer can't be relayed: the client gets a 502.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum Bad {
    #[error("invalid response head")]
    Head,
    #[error("response head too large")]
    TooLarge,
    #[error("invalid or conflicting Content-Length")]
    Length,
    #[error("unexpected 101 Switching Protocols")]
    Switching,
}

pub(super) enum Parsed {
    Partial,
    /// A 1xx other than 101, `len` bytes long: not passed on, the real answer follows.
    Interim(usize),
    Final(Answer),
}

/// Where a final answer's head goes, field by field: the relay's client head
/// ([`ClientHead`]) or the full path's response (`super::full_path`).
pub(super) trait HeadOut {
    /// The status line; `headers`: how many headers the upstream sent (some of them
    /// are not copied), to size what holds them.
    fn status(&mut self, status: u16, reason: &str, headers: usize);
    /// A header the client gets (not one of [`NOT_COPIED`]); its value starts `at`
    /// bytes into the head.
    fn header(&mut self, name: &str, value: &[u8], at: usize);
    fn end(&mut self, framing: Framing);
}

/// The client's HTTP/1.1 head: the upstream's status and headers less [`NOT_COPIED`],
/// the request ID, and `connection: close` when `close` (or the body is
/// close-delimited).
pub(super) struct ClientHead<'a> {
    pub out: &'a mut Vec<u8>,
    pub request_id: &'a [u8],
    pub close: bool,
}

impl HeadOut for ClientHead<'_> {
    fn status(&mut self, status: u16, reason: &str, _headers: usize) {
        let out = &mut *self.out;
        out.clear();
        out.extend_from_slice(b"HTTP/1.1 ");
        // httparse reads exactly three digits.
        out.extend_from_slice(&[
            b'0' + (status / 100 % 10) as u8,
            b'0' + (status / 10 % 10) as u8,
            b'0' + (status % 10) as u8,
        ]);
        out.push(b' ');
        out.extend_from_slice(reason.as_bytes());
        out.extend_from_slice(b"\r\n");
    }

    fn header(&mut self, name: &str, value: &[u8], _at: usize) {
        let out = &mut *self.out;
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }

    fn end(&mut self, framing: Framing) {
        let out = &mut *self.out;
        out.extend_from_slice(b"x-request-id: ");
        out.extend_from_slice(self.request_id);
        if self.close || framing == Framing::Close {
            out.extend_from_slice(b"\r\nconnection: close");
        }
        out.extend_from_slice(b"\r\n\r\n");
    }
}

/// Parses the head at the start of `buf`, and on a final answer gives `out` its status
/// and the headers the client gets.
pub(super) fn parse(buf: &[u8], head_request: bool, out: &mut impl HeadOut) -> Result<Parsed, Bad> {
    let mut headers = [httparse::EMPTY_HEADER; 100];
    let mut resp = httparse::Response::new(&mut headers);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
        Err(httparse::Error::TooManyHeaders) => return Err(Bad::TooLarge),
        Err(_) => return Err(Bad::Head),
    };
    let status = resp.code.ok_or(Bad::Head)?;
    match status {
        101 => return Err(Bad::Switching),
        100..=199 => return Ok(Parsed::Interim(len)),
        _ => {}
    }
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut encoded = false;
    let mut upstream_close = resp.version != Some(1);
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or(Bad::Length)?;
            if length.is_some_and(|l| l != n) {
                return Err(Bad::Length);
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            encoded = true;
            // Chunked only when it is the last coding; any other ends at close.
            chunked = h
                .value
                .rsplit(|&b| b == b',')
                .next()
                .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if h.name.eq_ignore_ascii_case("connection") {
            upstream_close |= h
                .value
                .split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"));
        }
    }
    let framing = if head_request || status == 204 || status == 304 {
        Framing::Empty
    } else if encoded {
        if chunked {
            Framing::Chunked
        } else {
            Framing::Close
        }
    } else {
        length.map_or(Framing::Close, Framing::Length)
    };
    out.status(status, resp.reason.unwrap_or(""), resp.headers.len());
    for h in resp.headers.iter() {
        let drop = skipped(h.name)
            // With Transfer-Encoding, Content-Length is not the framing (RFC 9112
            // §6.3): passing both on would let a later reader pick the other one.
            || (encoded && h.name.eq_ignore_ascii_case("content-length"));
        if !drop {
            // httparse's values are slices of `buf`.
            let at = (h.value.as_ptr() as usize).wrapping_sub(buf.as_ptr() as usize);
            out.header(h.name, h.value, at);
        }
    }
    out.end(framing);
    Ok(Parsed::Final(Answer {
        status,
        len,
        framing,
        reusable: !upstream_close && framing != Framing::Close,
    }))
}

fn skipped(name: &str) -> bool {
    NOT_COPIED
        .iter()
        .any(|n| n.len() == name.len() && n.eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(raw: &[u8], head: bool) -> (Answer, String) {
        let mut out = Vec::new();
        let mut head_out = ClientHead {
            out: &mut out,
            request_id: b"id-1",
            close: false,
        };
        match parse(raw, head, &mut head_out) {
            Ok(Parsed::Final(a)) => (a, String::from_utf8_lossy(&out).into_owned()),
            Ok(Parsed::Interim(_)) => panic!("interim"),
            Ok(Parsed::Partial) => panic!("partial"),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn frames_as_rfc_9112_says() {
        let (a, out) = answer(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive\r\nX-Request-Id: up\r\n\r\nhello",
            false,
        );
        assert_eq!(
            (a.status, a.framing, a.reusable),
            (200, Framing::Length(5), true)
        );
        assert_eq!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nx-request-id: id-1\r\n\r\n"
        );
        let (a, out) = answer(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
            false,
        );
        assert_eq!(a.framing, Framing::Chunked);
        assert!(
            !out.to_ascii_lowercase().contains("content-length"),
            "{out}"
        );
        assert!(out.contains("Transfer-Encoding: chunked"), "{out}");
        let (a, out) = answer(b"HTTP/1.1 200 OK\r\n\r\n", false);
        assert_eq!((a.framing, a.reusable), (Framing::Close, false));
        assert!(out.ends_with("connection: close\r\n\r\n"), "{out}");
        let (a, _) = answer(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", true);
        assert_eq!((a.framing, a.reusable), (Framing::Empty, true));
        let (a, _) = answer(
            b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
            false,
        );
        assert_eq!(a.framing, Framing::Empty);
        let (a, _) = answer(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n",
            false,
        );
        assert!(!a.reusable);
        let (a, _) = answer(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n", false);
        assert!(!a.reusable);
    }

    #[test]
    fn refuses_conflicting_lengths_and_switching() {
        let mut buf = Vec::new();
        let mut out = ClientHead {
            out: &mut buf,
            request_id: b"id",
            close: false,
        };
        for raw in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n",
            b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
            b"HTTP/1.1 2000 OK\r\n\r\n",
        ] {
            assert!(
                parse(raw, false, &mut out).is_err(),
                "{}",
                String::from_utf8_lossy(raw)
            );
        }
        assert!(matches!(
            parse(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200", false, &mut out),
            Ok(Parsed::Interim(n)) if n == 40
        ));
    }
}
