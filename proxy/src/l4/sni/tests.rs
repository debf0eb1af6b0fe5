use std::sync::Arc;

use rustls::crypto::ring;
use rustls::{ClientConfig, ClientConnection, RootCertStore};
use rustls_pki_types::ServerName;

use super::*;

/// The bytes a real rustls client sends first for `name`.
fn hello_from_rustls(name: &str) -> Vec<u8> {
    let config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|e| panic!("{e}"))
        .with_root_certificates(RootCertStore::empty())
        .with_no_client_auth();
    let server = ServerName::try_from(name.to_owned()).unwrap_or_else(|e| panic!("{e}"));
    let mut conn =
        ClientConnection::new(Arc::new(config), server).unwrap_or_else(|e| panic!("{e}"));
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).unwrap_or_else(|e| panic!("{e}"));
    }
    out
}

#[test]
fn reads_the_name_of_a_real_client_hello_and_needs_more_for_every_prefix() {
    let hello = hello_from_rustls("passthrough.example.com");
    assert_eq!(
        parse(&hello),
        Hello::ServerName("passthrough.example.com".to_owned())
    );
    for cut in 0..hello.len() {
        assert_eq!(parse(&hello[..cut]), Hello::NeedMore, "prefix {cut}");
    }
    // Bytes after the hello (the client's next flight) change nothing.
    let mut more = hello.clone();
    more.extend_from_slice(&[23, 3, 3, 0, 1, 0]);
    assert!(matches!(parse(&more), Hello::ServerName(_)));
}

#[test]
fn an_ip_address_server_name_sends_no_sni() {
    let hello = hello_from_rustls("127.0.0.1");
    assert_eq!(parse(&hello), Hello::NoServerName);
}

#[test]
fn a_hello_split_across_records_is_reassembled() {
    let hello = hello_from_rustls("split.example.com");
    let body = &hello[5..];
    let (a, b) = body.split_at(7);
    let mut split = Vec::new();
    for part in [a, b] {
        split.extend_from_slice(&[22, 3, 1]);
        split.extend_from_slice(&u16::try_from(part.len()).unwrap_or(0).to_be_bytes());
        split.extend_from_slice(part);
    }
    assert_eq!(
        parse(&split),
        Hello::ServerName("split.example.com".to_owned())
    );
}

#[test]
fn garbage_is_invalid_not_a_wait() {
    assert!(matches!(
        parse(b"GET / HTTP/1.1\r\n\r\n"),
        Hello::Invalid(_)
    ));
    assert!(matches!(parse(&[22, 3, 1, 0, 0]), Hello::Invalid(_)));
    assert!(matches!(
        parse(&[22, 3, 1, 0, 4, 2, 0, 0, 0]),
        Hello::Invalid(_)
    ));
    // A complete record whose hello claims more fields than it has.
    assert!(matches!(
        parse(&[22, 3, 1, 0, 6, 1, 0, 0, 2, 3, 3]),
        Hello::Invalid(_)
    ));
    // A hello claiming to be larger than the limit.
    assert!(matches!(
        parse(&[22, 3, 1, 0, 4, 1, 2, 0, 0]),
        Hello::Invalid(_)
    ));
}
