//! Arbitrary YAML through the manifest parser and the reconciler: no panic, every
//! Gateway of an accepted class gets a status, and the incremental reconciler equals
//! the full one after every step. The input's documents are applied one at a time; a
//! document whose first line is `#delete` withdraws the object it names instead.

#![no_main]

use std::path::Path;

use aether_controller::{Reconciler, Settings, Store, manifest, reconcile};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let settings = Settings {
        controller_name: "aether.io/edge".into(),
        address_pool: "127.0.1.0/28".parse().unwrap_or_else(|_| unreachable!()),
    };
    let mut store = Store::default();
    let mut incremental = Reconciler::standalone(settings.clone());
    for (line, doc) in manifest::documents(&text) {
        let Ok(Some(object)) = manifest::parse_document(Path::new("fuzz.yaml"), line, doc) else {
            continue;
        };
        if doc.starts_with("#delete") {
            store.remove(&object.id());
        } else {
            store.apply(object);
        }
        let outcome = incremental.reconcile(&store);
        let full = reconcile(&store, &settings);
        assert!(
            serde_json::to_value(&outcome.snapshot).ok() == serde_json::to_value(&full.snapshot).ok(),
            "incremental and full Snapshots differ"
        );
        assert!(outcome.statuses == full.statuses, "incremental and full statuses differ");
        assert_eq!(outcome.endpoint_interest, full.endpoint_interest);
        for (key, gw) in &store.gateways {
            let ours = store
                .gateway_classes
                .get(&gw.spec.gateway_class_name)
                .is_some_and(|c| c.spec.controller_name == settings.controller_name);
            assert_eq!(
                ours,
                outcome.statuses.gateways.contains_key(key),
                "status of Gateway {key}"
            );
        }
        let _ = outcome.statuses.items();
    }
});
