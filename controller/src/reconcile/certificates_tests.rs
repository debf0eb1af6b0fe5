//! certificateRef resolution against Secrets as the Store keeps them: the size cap.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

use super::*;
use crate::Object;
use crate::tls_secret::MAX_TLS_FIELD_BYTES;

/// A Secret `name` holding a valid certificate and key, the certificate followed by
/// `padding` bytes of text outside any PEM block (which PEM parsers skip).
fn secret(name: &str, padding: usize) -> Secret {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["secure.example.com".to_owned()])
        .and_then(|p| p.self_signed(&key))
        .unwrap();
    let mut crt = cert.pem().into_bytes();
    crt.extend(std::iter::repeat_n(b'x', padding));
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(BTreeMap::from([
            ("tls.crt".into(), ByteString(crt)),
            (
                "tls.key".into(),
                ByteString(key.serialize_pem().into_bytes()),
            ),
        ])),
        ..Secret::default()
    }
}

fn tls(name: &str) -> GatewayListenersTls {
    serde_json::from_value(json!({"mode": "Terminate", "certificateRefs": [{"name": name}]}))
        .unwrap()
}

#[test]
fn a_secret_over_the_size_cap_is_an_invalid_ref_that_says_so_and_keeps_no_data() {
    // Padded to just under the cap: still served (the padding alone changes nothing).
    let fits = secret("fits", MAX_TLS_FIELD_BYTES - 2000);
    let huge = secret("huge", MAX_TLS_FIELD_BYTES + 1);
    let store = Store::from_objects([
        Object::Secret(Box::new(fits)),
        Object::Secret(Box::new(huge)),
    ]);
    assert!(resolve(&store, "Gateway", "ns", Some(&tls("fits"))).is_ok());

    let Err((reason, message)) = resolve(&store, "Gateway", "ns", Some(&tls("huge"))) else {
        panic!("an oversized Secret was accepted");
    };
    assert_eq!(reason, "InvalidCertificateRef");
    assert!(
        message.starts_with("Secret ns/huge is too large: tls.crt is "),
        "{message}"
    );
    assert!(
        message.contains("over the limit of 262144 bytes"),
        "{message}"
    );
    let kept = &store.secrets[&ObjectKey::new("ns", "huge")];
    assert_eq!(kept.data, None, "an oversized Secret's data is not kept");

    // Fixed in place: the same Secret, small again, serves.
    let mut store = store;
    store.apply(Object::Secret(Box::new(secret("huge", 0))));
    assert!(resolve(&store, "Gateway", "ns", Some(&tls("huge"))).is_ok());
    assert!(store.oversized_secrets.is_empty());
}

#[test]
fn a_malformed_secret_is_an_invalid_ref() {
    let mut bad = secret("bad", 0);
    bad.data = Some(BTreeMap::from([
        ("tls.crt".into(), ByteString(b"not a certificate".to_vec())),
        ("tls.key".into(), ByteString(b"not a key".to_vec())),
    ]));
    let store = Store::from_objects([Object::Secret(Box::new(bad))]);
    let Err((reason, message)) = resolve(&store, "Gateway", "ns", Some(&tls("bad"))) else {
        panic!("a malformed Secret was accepted");
    };
    assert_eq!(reason, "InvalidCertificateRef");
    assert!(message.starts_with("Secret ns/bad: "), "{message}");
}
