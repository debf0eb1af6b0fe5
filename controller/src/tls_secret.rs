//! What the Store keeps of a Secret: its name and the two fields a listener's
//! certificateRef reads (`tls.crt`, `tls.key`), each at most [`MAX_TLS_FIELD_BYTES`].
//! A Secret over the cap keeps no data at all and is remembered as too large, so the
//! listener says so instead of a parse error.

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The most bytes of `tls.crt` or `tls.key` kept. A real chain is a few KiB (a leaf and
/// two intermediates with RSA-4096 keys are under 8 KiB; a key is smaller), so 256 KiB
/// is over 30 times anything legitimate. The cap bounds what one Secret costs us: the
/// watch lists every `kubernetes.io/tls` Secret of the cluster, the Store is copied for
/// every reconcile, and the API server alone would allow 1 MiB per Secret.
pub const MAX_TLS_FIELD_BYTES: usize = 256 * 1024;

/// The fields a certificateRef reads.
pub const TLS_FIELDS: [&str; 2] = ["tls.crt", "tls.key"];

/// Trims `secret` to what is read: name, namespace, type and the TLS fields (no
/// annotations: `kubectl apply` copies the whole Secret into one; no resourceVersion:
/// an update that leaves the fields as they were must be no change to the Store). When a
/// TLS field is over the cap, nothing of its data is kept and the reason is returned.
pub fn trim(secret: Secret) -> (Secret, Option<String>) {
    let meta = secret.metadata;
    let mut data = secret.data.unwrap_or_default();
    let mut string_data = secret.string_data.unwrap_or_default();
    data.retain(|k, _| TLS_FIELDS.contains(&k.as_str()));
    string_data.retain(|k, _| TLS_FIELDS.contains(&k.as_str()));
    let sizes = data
        .iter()
        .map(|(k, v)| (k, v.0.len()))
        .chain(string_data.iter().map(|(k, v)| (k, v.len())));
    let too_large: Vec<String> = sizes
        .filter(|(_, len)| *len > MAX_TLS_FIELD_BYTES)
        .map(|(k, len)| format!("{k} is {len} bytes"))
        .collect();
    let why = (!too_large.is_empty()).then(|| {
        format!(
            "{}, over the limit of {MAX_TLS_FIELD_BYTES} bytes per field",
            too_large.join(" and ")
        )
    });
    if why.is_some() {
        data.clear();
        string_data.clear();
    }
    let trimmed = Secret {
        metadata: ObjectMeta {
            name: meta.name,
            namespace: meta.namespace,
            ..ObjectMeta::default()
        },
        type_: secret.type_,
        data: (!data.is_empty()).then_some(data),
        string_data: (!string_data.is_empty()).then_some(string_data),
        immutable: None,
    };
    (trimmed, why)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;

    use super::*;

    fn secret(crt: Vec<u8>) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("s".into()),
                namespace: Some("ns".into()),
                annotations: Some(BTreeMap::from([("big".into(), "x".repeat(1000))])),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([
                ("tls.crt".into(), ByteString(crt)),
                ("tls.key".into(), ByteString(b"key".to_vec())),
                ("ca.crt".into(), ByteString(vec![b'c'; 5000])),
            ])),
            ..Secret::default()
        }
    }

    #[test]
    fn keeps_only_the_tls_fields_under_the_cap() {
        let (kept, why) = trim(secret(vec![b'a'; MAX_TLS_FIELD_BYTES]));
        assert_eq!(why, None);
        let data = kept.data.unwrap_or_default();
        assert_eq!(
            data.keys().map(String::as_str).collect::<Vec<_>>(),
            ["tls.crt", "tls.key"]
        );
        assert_eq!(kept.metadata.annotations, None);
        assert_eq!(kept.metadata.name.as_deref(), Some("s"));
    }

    #[test]
    fn over_the_cap_keeps_nothing_and_says_why() {
        let (kept, why) = trim(secret(vec![b'a'; MAX_TLS_FIELD_BYTES + 1]));
        assert_eq!(kept.data, None);
        assert_eq!(
            why.as_deref(),
            Some("tls.crt is 262145 bytes, over the limit of 262144 bytes per field")
        );
    }
}
