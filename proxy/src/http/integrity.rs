//! Requests refused before routing because the edge and a backend could read them
//! differently (the root of request smuggling).
//!
//! Framing conflicts are settled by hyper before a request gets here: a request with
//! both Content-Length and Transfer-Encoding is framed by Transfer-Encoding and its
//! Content-Length dropped (RFC 9112 §6.3), an invalid or conflicting Content-Length is
//! a 400, and the edge re-frames every body it forwards. What hyper leaves to the
//! application is which host a request is for.

use http::{Request, header};

/// Why a request is refused; the text is the client's 400 body.
pub fn check<B>(req: &Request<B>) -> Result<(), &'static str> {
    let h = req.headers();
    // An absolute-form target must agree with Host, or routing and the backend would
    // see two different hosts.
    if req.version() <= http::Version::HTTP_11
        && let (Some(authority), Some(host)) = (req.uri().authority(), h.get(header::HOST))
        && !host
            .as_bytes()
            .eq_ignore_ascii_case(authority.as_str().as_bytes())
    {
        return Err("request target and Host disagree\n");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absolute_target_must_agree_with_host() {
        let disagree = Request::builder()
            .uri("http://a.example.com/x")
            .header("host", "b.example.com")
            .body(())
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(check(&disagree).is_err());
        let fine = Request::builder()
            .uri("http://a.example.com/x")
            .header("host", "A.example.com")
            .body(())
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(check(&fine).is_ok());
    }
}
