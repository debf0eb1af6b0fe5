//! What the controller's unit tests share: a store from YAML, the usual settings and
//! addressings, an outcome in one call, and a condition by type.

use std::net::Ipv4Addr;
use std::path::Path;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::manifest;
use crate::reconcile::services::ServiceSettings;
use crate::reconcile::{Addressing, Outcome, Settings, reconcile, reconcile_with};
use crate::store::{ObjectKey, Store};

/// The settings of every test: controller `aether.io/edge`, pool 127.0.1.0/24.
pub fn settings() -> Settings {
    Settings {
        controller_name: "aether.io/edge".into(),
        address_pool: "127.0.1.0/24".parse().unwrap(),
    }
}

/// The objects of `yaml` (one or more documents), which must all parse.
pub fn store(yaml: &str) -> Store {
    let parsed = manifest::parse(Path::new("t.yaml"), yaml);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    Store::from_objects(parsed.objects)
}

/// The shared edge Service `edge-system/aether-edge`.
pub fn shared_service() -> ServiceSettings {
    ServiceSettings::shared(ObjectKey::new("edge-system", "aether-edge"))
}

/// Kubernetes mode: internal ports from `range` (`20000-29999`), behind `service`.
pub fn internal_ports(range: &str, service: ServiceSettings) -> Addressing {
    Addressing::InternalPorts {
        range: range.parse().unwrap(),
        service,
        bind: Ipv4Addr::UNSPECIFIED.into(),
    }
}

/// Standalone mode: what `reconcile` does with `yaml`.
pub fn outcome(yaml: &str) -> Outcome {
    reconcile(&store(yaml), &settings())
}

/// What `reconcile_with` does with `yaml` under `addressing`.
pub fn outcome_with(yaml: &str, addressing: &Addressing) -> Outcome {
    reconcile_with(&store(yaml), &settings(), addressing)
}

/// (status, reason) of the condition of type `t`, which must be there.
pub fn condition<'a>(conds: &'a [Condition], t: &str) -> (&'a str, &'a str) {
    let c = conds
        .iter()
        .find(|c| c.type_ == t)
        .unwrap_or_else(|| panic!("no {t} condition in {conds:?}"));
    (c.status.as_str(), c.reason.as_str())
}

/// (status, reason, message) of Gateway `ns/name`'s condition of type `t`, if any.
pub fn gateway_condition(
    out: &Outcome,
    ns: &str,
    name: &str,
    t: &str,
) -> Option<(String, String, String)> {
    let st = &out.statuses.gateways[&ObjectKey::new(ns, name)].status;
    st.conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == t)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}
