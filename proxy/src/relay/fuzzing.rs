//! The relay's parsers under arbitrary bytes (the `relay` cargo-fuzz target and the
//! tests below): each check panics when a property fails.

use super::chunked::Chunked;
use super::request;
use super::response::{self, Parsed};

/// A chunked body's end is found at the same place whether the bytes come at once or
/// split at `cut`, and never past them.
pub fn chunked(data: &[u8], cut: usize) {
    let whole = Chunked::default().feed(data);
    let cut = cut.min(data.len());
    let mut split = Chunked::default();
    let first = split.feed(&data[..cut]);
    let in_two = match first {
        Ok(Some(end)) => Ok(Some(end)),
        Ok(None) => split.feed(&data[cut..]).map(|end| end.map(|e| e + cut)),
        Err(e) => Err(e),
    };
    match (&whole, &in_two) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "cut at {cut}"),
        (Err(_), Err(_)) => {}
        // A split may fail earlier or later on the same malformed bytes only if the
        // whole failed too; a success must not depend on the split.
        _ => panic!("cut at {cut}: whole {whole:?}, split {in_two:?}"),
    }
    if let Ok(Some(end)) = whole {
        assert!(end <= data.len());
    }
}

/// An answer head the relay accepts is written back as a head that parses, with one
/// `x-request-id` and no `Content-Length` beside `Transfer-Encoding`.
pub fn answer(data: &[u8]) {
    let mut out = Vec::new();
    let mut head = response::ClientHead {
        out: &mut out,
        request_id: b"fuzz-id",
        close: false,
    };
    if let Ok(Parsed::Final(a)) = response::parse(data, false, &mut head) {
        assert!(a.len <= data.len());
        let mut headers = [httparse::EMPTY_HEADER; 128];
        let mut again = httparse::Response::new(&mut headers);
        let parsed = again.parse(&out);
        assert!(
            matches!(parsed, Ok(httparse::Status::Complete(n)) if n == out.len()),
            "{parsed:?}: {}",
            String::from_utf8_lossy(&out)
        );
        let named = |n: &str| {
            again
                .headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case(n))
                .count()
        };
        assert_eq!(named("x-request-id"), 1);
        if named("transfer-encoding") > 0 {
            assert_eq!(named("content-length"), 0);
        }
    }
}

/// A request head the relay takes is written upstream as a head that parses, with the
/// same method and target, and without hop-by-hop or client-set forwarding headers.
pub fn request(data: &[u8]) {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    if !matches!(req.parse(data), Ok(httparse::Status::Complete(_))) {
        return;
    }
    let Some(head) = request::take(&req) else {
        return;
    };
    let mut out = Vec::new();
    head.write_upstream(&mut out, b"192.0.2.1", "http", b"fuzz-id");
    let mut headers = [httparse::EMPTY_HEADER; 80];
    let mut up = httparse::Request::new(&mut headers);
    let parsed = up.parse(&out);
    assert!(
        matches!(parsed, Ok(httparse::Status::Complete(n)) if n == out.len()),
        "{parsed:?}: {}",
        String::from_utf8_lossy(&out)
    );
    assert_eq!(up.method, Some(head.method.as_str()));
    assert_eq!(up.path, Some(head.target));
    for h in up.headers.iter() {
        for banned in [
            "connection",
            "transfer-encoding",
            "upgrade",
            "te",
            "keep-alive",
        ] {
            assert!(!h.name.eq_ignore_ascii_case(banned), "{}", h.name);
        }
        if h.name.eq_ignore_ascii_case("x-forwarded-for") {
            assert_eq!(h.value, b"192.0.2.1");
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_fuzz_properties_hold_for_hand_written_inputs() {
        let chunked = b"4\r\nwiki\r\n5;x\r\npedia\r\n0\r\nt: v\r\n\r\nrest";
        for cut in 0..chunked.len() {
            super::chunked(chunked, cut);
        }
        super::chunked(b"5\r\nhel", 2);
        super::answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\nX-Request-Id: a\r\nX-Request-Id: b\r\n\r\n");
        super::answer(b"HTTP/1.1 204 No Content\r\n\r\n");
        super::request(b"GET /a?b HTTP/1.1\r\nHost: h\r\nConnection: keep-alive\r\nTE: trailers\r\nX-Forwarded-For: 1.1.1.1\r\n\r\n");
        super::request(b"HEAD / HTTP/1.1\r\nhost: h\r\n\r\n");
    }
}
