//! Dedicated Gateways (Kubernetes mode): a Gateway annotated `aether.io/dedicated: "true"`
//! gets edge pods of its own. The controller writes a Deployment of the edge binary
//! told to serve that one Gateway (`--serve-gateway`), and a headless Service that
//! selects its pods; the Gateway's own Service then points at those pods (through the
//! EndpointSlices we mirror, as for any Gateway) instead of the shared edge pods, which stop
//! binding the Gateway's internal ports.
//!
//! Both objects live in the edge's namespace, not the Gateway's: that is where the edge's
//! ServiceAccount and RBAC are, so no Role or RoleBinding has to be created per Gateway
//! (which would need the controller to hold `bind`/`escalate`). The price is that an
//! owner reference can't cross namespaces: the controller deletes them itself when the
//! Gateway goes or drops the annotation, by their labels.

use std::collections::BTreeMap;

use gateway_api::gateways::Gateway;
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
pub use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::conditions as cond;
use super::services::{
    LABEL_GATEWAY_API_NAME, LABEL_GATEWAY_NAME, LABEL_GATEWAY_NAMESPACE, LABEL_MANAGED_BY,
    MANAGED_BY,
};
use crate::store::ObjectKey;

/// Opts a Gateway into pods of its own.
pub const ANNOTATION: &str = "aether.io/dedicated";
/// How many pods a dedicated Gateway gets (default [`DEFAULT_REPLICAS`]).
pub const ANNOTATION_REPLICAS: &str = "aether.io/dedicated-replicas";
/// The pod label a dedicated Deployment selects; its value is the Deployment's name.
pub const LABEL_POD: &str = "aether.io/dedicated";
/// The condition type that says how a dedicated Gateway is served. Implementation
/// specific, so domain-prefixed as the spec asks.
pub const CONDITION: &str = "aether.io/Dedicated";
/// Two, like the chart's shared edge: one pod can drain while the other serves.
pub const DEFAULT_REPLICAS: i32 = 2;
const MAX_REPLICAS: i32 = 100;
/// The container of the template that runs the edge binary; it gets `--serve-gateway`.
pub const CONTAINER: &str = "edge";

/// Where dedicated Deployments go and what their pods look like. The template is the
/// chart's own edge pod (rendered into a ConfigMap by the same Helm helper as the edge
/// Deployment), so dedicated pods run with the same image, flags, resources, probes and
/// security context as the shared ones.
#[derive(Debug, Clone, PartialEq)]
pub struct DedicatedSettings {
    pub namespace: String,
    pub template: PodTemplateSpec,
}

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("not a PodTemplateSpec: {0}")]
    Parse(#[from] serde_saphyr::Error),
    #[error("no container named {CONTAINER:?} to run the edge in")]
    NoEdgeContainer,
}

/// Reads the pod template (YAML) that dedicated Gateways' pods are made from.
pub fn parse_template(text: &str) -> Result<PodTemplateSpec, TemplateError> {
    let template: PodTemplateSpec = serde_saphyr::from_str(text)?;
    let has_edge = template
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .any(|c| c.name == CONTAINER);
    if !has_edge {
        return Err(TemplateError::NoEdgeContainer);
    }
    Ok(template)
}

/// What a Gateway's annotations ask for: `None` when it doesn't ask, else the replica
/// count or why the annotations are invalid.
pub fn requested(gw: &Gateway) -> Option<Result<i32, String>> {
    let annotations = gw.metadata.annotations.as_ref()?;
    match annotations.get(ANNOTATION).map(String::as_str) {
        Some("true") => {}
        Some("false") | None => return None,
        Some(other) => {
            return Some(Err(format!(
                "annotation {ANNOTATION} is {other:?}; use \"true\" or \"false\""
            )));
        }
    }
    let Some(raw) = annotations.get(ANNOTATION_REPLICAS) else {
        return Some(Ok(DEFAULT_REPLICAS));
    };
    Some(match raw.parse::<i32>() {
        Ok(n) if (1..=MAX_REPLICAS).contains(&n) => Ok(n),
        _ => Err(format!(
            "annotation {ANNOTATION_REPLICAS} is {raw:?}; use a number from 1 to {MAX_REPLICAS}"
        )),
    })
}

/// The Deployment's (and its headless Service's) name: `aether-<namespace>-<gateway>`,
/// shortened with a stable hash to stay a DNS label (it is also a label value).
pub fn name(key: &ObjectKey) -> String {
    let name = format!("aether-{}-{}", key.namespace(), key.name());
    if name.len() <= 63 {
        return name;
    }
    let h = super::services::fnv1a_32(key.as_str().bytes());
    let head: String = name.chars().take(54).collect();
    format!("{}-{h:08x}", head.trim_end_matches('-'))
}

fn selector_labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(LABEL_POD.to_owned(), name.to_owned())])
}

/// The headless Service selecting a dedicated Gateway's pods: the cluster keeps its
/// EndpointSlices current with the pods' readiness, and the Gateway's Service mirrors them.
pub fn pods_service_key(settings: &DedicatedSettings, key: &ObjectKey) -> ObjectKey {
    ObjectKey::new(settings.namespace.as_str(), name(key))
}

/// The Deployment and headless Service for a dedicated Gateway.
#[derive(Debug, Clone, PartialEq)]
pub struct DedicatedObjects {
    pub deployment: Deployment,
    /// At most one pod of the Gateway's away at a time for voluntary disruptions.
    pub budget: PodDisruptionBudget,
    pub pods: Service,
}

/// Builds both objects. `spec.infrastructure` labels and annotations go on each of
/// them and on the pods, as the spec asks of everything made for a Gateway.
pub fn objects(
    settings: &DedicatedSettings,
    key: &ObjectKey,
    gw: &Gateway,
    replicas: i32,
) -> DedicatedObjects {
    let name = name(key);
    let infra = gw.spec.infrastructure.as_ref();
    let infra_labels: BTreeMap<String, String> = infra
        .and_then(|i| i.labels.clone())
        .unwrap_or_default()
        .into_iter()
        .collect();
    let infra_annotations: BTreeMap<String, String> = infra
        .and_then(|i| i.annotations.clone())
        .unwrap_or_default()
        .into_iter()
        .collect();
    let mut labels = infra_labels.clone();
    labels.insert(LABEL_GATEWAY_NAME.to_owned(), key.name().to_string());
    labels.insert(LABEL_GATEWAY_API_NAME.to_owned(), key.name().to_string());
    labels.insert(
        LABEL_GATEWAY_NAMESPACE.to_owned(),
        key.namespace().to_string(),
    );
    labels.insert(LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned());
    let selector = selector_labels(&name);
    let meta = |labels: &BTreeMap<String, String>| ObjectMeta {
        name: Some(name.clone()),
        namespace: Some(settings.namespace.clone()),
        labels: Some(labels.clone()),
        annotations: (!infra_annotations.is_empty()).then(|| infra_annotations.clone()),
        ..ObjectMeta::default()
    };

    let mut template = settings.template.clone();
    let pod_meta = template.metadata.get_or_insert_with(ObjectMeta::default);
    let pod_labels = pod_meta.labels.get_or_insert_with(BTreeMap::new);
    // The template is the shared edge's pod: drop its labels that the shared edge
    // Deployment selects on, or that Deployment would count these pods as its own.
    pod_labels.retain(|k, _| !k.starts_with("app.kubernetes.io/"));
    pod_labels.extend(infra_labels);
    pod_labels.extend(selector.clone());
    pod_labels.insert(LABEL_GATEWAY_NAME.to_owned(), key.name().to_string());
    pod_labels.insert(LABEL_GATEWAY_API_NAME.to_owned(), key.name().to_string());
    pod_labels.insert(
        LABEL_GATEWAY_NAMESPACE.to_owned(),
        key.namespace().to_string(),
    );
    if !infra_annotations.is_empty() {
        pod_meta
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend(infra_annotations.clone());
    }
    if let Some(spec) = template.spec.as_mut() {
        for c in spec.containers.iter_mut().filter(|c| c.name == CONTAINER) {
            c.args
                .get_or_insert_with(Vec::new)
                .push(format!("--serve-gateway={key}"));
        }
        // Spread these pods among themselves, not relative to the shared edge's.
        for t in spec.topology_spread_constraints.iter_mut().flatten() {
            t.label_selector = Some(LabelSelector {
                match_labels: Some(selector.clone()),
                match_expressions: None,
            });
        }
    }
    let admin_port = settings
        .template
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .filter(|c| c.name == CONTAINER)
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some("admin"))
        .map_or(9901, |p| p.container_port);

    let deployment = Deployment {
        metadata: meta(&labels),
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(selector.clone()),
                match_expressions: None,
            },
            // Surge first, as the shared edge does: a new pod is ready before an old
            // one starts draining.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".to_owned()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            template,
            ..DeploymentSpec::default()
        }),
        status: None,
    };
    let pods = Service {
        metadata: meta(&labels),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_owned()),
            selector: Some(selector),
            // Endpoints are published before the pods are ready: the Gateway Service's
            // slices carry readiness through, and load balancers act on it.
            publish_not_ready_addresses: Some(true),
            ports: Some(vec![ServicePort {
                name: Some("admin".to_owned()),
                port: admin_port,
                target_port: Some(IntOrString::Int(admin_port)),
                protocol: Some("TCP".to_owned()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    };
    let budget = PodDisruptionBudget {
        metadata: meta(&labels),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(&name)),
                match_expressions: None,
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    };
    DedicatedObjects {
        deployment,
        budget,
        pods,
    }
}

/// The Gateway's `aether.io/Dedicated` condition.
pub fn condition(generation: i64, state: &Result<String, String>) -> Condition {
    match state {
        Ok(deployment) => cond::condition(
            CONDITION,
            true,
            "Provisioned",
            format!("served by the pods of Deployment {deployment} only"),
            generation,
        ),
        Err(why) => cond::condition(
            CONDITION,
            false,
            "NotProvisioned",
            format!("{why}; served by the shared edge pods"),
            generation,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stay_dns_labels_and_distinct() {
        assert_eq!(name(&ObjectKey::new("ns", "gw")), "aether-ns-gw");
        let a = name(&ObjectKey::new("n".repeat(40), "g".repeat(40)));
        let b = name(&ObjectKey::new("n".repeat(41), "g".repeat(39)));
        assert!(a.len() <= 63 && b.len() <= 63, "{a} {b}");
        assert_ne!(a, b);
    }
}

#[cfg(test)]
#[path = "dedicated_tests.rs"]
mod plan_tests;
