//! Bad certificate Secrets through a real API server: one Gateway with a listener on a
//! malformed Secret, one on a Secret over the edge's size cap (but under the API
//! server's own), and a good one. The bad two say why in their conditions; the good one
//! keeps serving HTTPS to a real TLS client; the edge stays up.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use aether_test_support::tls::{TestCa, tls_connect};
use aether_test_support::{H1Conn, Resp};
use gateway_api::gateways::Gateway;
use gateway_api::httproutes::HttpRoute;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::{BoxError, Cluster};
use crate::{
    Net, Wait, apply, class_and_namespaces, edge, eventually_some, listener_condition, m, put,
    service_ports,
};

const NS: &str = "certs";
const HOST: &str = "secure.example.com";
/// Over the edge's 256 KiB per field, well under the API server's 1 MiB per Secret.
const OVERSIZED: usize = 300 * 1024;

/// A `kubernetes.io/tls` Secret, written as `stringData` (the server stores it as
/// `data`).
async fn tls_secret(client: &Client, name: &str, crt: &str, key: &str) {
    put::<Secret>(client, &m::tls_secret(NS, name, crt, key)).await;
}

/// (status, reason, message) of ResolvedRefs on listener `name`.
fn resolved_refs(gw: &Gateway, name: &str) -> Option<(String, String, String)> {
    listener_condition(gw, name, "ResolvedRefs")
}

/// One HTTPS request to `addr` with SNI `HOST`, trusting only `ca`.
async fn https_get(addr: SocketAddr, ca: &TestCa) -> Result<Resp, BoxError> {
    let (tls, _) = tls_connect(
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        addr,
        HOST,
        ca,
        &[b"http/1.1"],
    )
    .await?;
    H1Conn::over(tls).await?.get(HOST, "/hello").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_secrets_are_conditions_and_the_good_listener_serves()
-> Result<(), BoxError> {
    let Some(cluster) = Cluster::start().await? else {
        return Ok(());
    };
    let client = cluster.client().await?;
    class_and_namespaces(&client, &[NS]).await;

    let ca = TestCa::new("secrets-ca")?;
    let leaf = ca.leaf(&[HOST])?;
    let (crt, key) = (leaf.cert_pem, leaf.key_pem);
    tls_secret(&client, "good", &crt, &key).await;
    tls_secret(
        &client,
        "garbage",
        "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n",
        "nope",
    )
    .await;
    // A valid certificate and key, padded past the cap with text PEM parsers skip:
    // only the size is wrong with it.
    let padded = format!("{crt}{}", "x".repeat(OVERSIZED));
    tls_secret(&client, "huge", &padded, &key).await;

    let listener = |name: &str, port: u16, secret: &str| {
        json!({"name": name, "port": port, "protocol": "HTTPS", "hostname": HOST,
               "tls": {"mode": "Terminate", "certificateRefs": [{"name": secret}]}})
    };
    apply(
        &Api::<Gateway>::namespaced(client.clone(), NS),
        "gw",
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
               "metadata": {"name": "gw", "namespace": NS},
               "spec": {"gatewayClassName": "aether", "listeners": [
                   listener("good", 443, "good"),
                   listener("malformed", 8443, "garbage"),
                   listener("oversized", 9443, "huge")]}}),
    )
    .await;
    apply(
        &Api::<HttpRoute>::namespaced(client.clone(), NS),
        "r",
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
               "metadata": {"name": "r", "namespace": NS},
               "spec": {"parentRefs": [{"name": "gw"}], "hostnames": [HOST],
                        "rules": [{"filters": [{"type": "RequestRedirect",
                            "requestRedirect": {"hostname": "moved.example.com", "statusCode": 302}}]}]}}),
    )
    .await;
    // Internal ports on a loopback network of its own: the port range is shared.
    let listen = Net::allocate().ip_str(1);
    let mut edge = edge(&cluster, &listen, "secrets");

    let gateways = Api::<Gateway>::namespaced(client.clone(), NS);
    let (malformed, oversized) =
        eventually_some("both bad listeners' conditions", Wait::API, || async {
            let gw = gateways.get("gw").await.ok()?;
            let good = resolved_refs(&gw, "good")?;
            let malformed = resolved_refs(&gw, "malformed")?;
            let oversized = resolved_refs(&gw, "oversized")?;
            (good.0 == "True" && malformed.0 == "False" && oversized.0 == "False")
                .then_some((malformed, oversized))
        })
        .await?;
    assert_eq!(malformed.1, "InvalidCertificateRef", "{malformed:?}");
    assert!(
        malformed.2.starts_with("Secret certs/garbage: "),
        "{malformed:?}"
    );
    assert!(!malformed.2.contains("too large"), "{malformed:?}");
    assert_eq!(oversized.1, "InvalidCertificateRef", "{oversized:?}");
    assert!(
        oversized
            .2
            .starts_with("Secret certs/huge is too large: tls.crt is ")
            && oversized.2.contains("over the limit of 262144 bytes"),
        "{oversized:?}"
    );

    // The good listener serves HTTPS with its certificate, through the internal port
    // its Service targets.
    let (_, ports) = service_ports(&client, NS, "gw").await;
    let internal = ports
        .iter()
        .find(|(port, _)| *port == 443)
        .map(|(_, target)| u16::try_from(*target))
        .ok_or("no Service port 443")??;
    let addr = SocketAddr::new(listen.parse()?, internal);
    let answer = eventually_some("HTTPS through the good listener", Wait::API, || async {
        https_get(addr, &ca).await.ok().filter(|r| r.status == 302)
    })
    .await?;
    assert_eq!(
        answer.header("location"),
        Some("https://moved.example.com/hello"),
        "{answer:?}"
    );
    assert!(edge.try_exit()?.is_none(), "the edge exited");
    cluster.pass()
}
