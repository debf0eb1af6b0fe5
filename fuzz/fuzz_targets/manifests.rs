//! Arbitrary YAML through the manifest parser and the reconciler: no panic, and every
//! Gateway of an accepted class gets a status.

#![no_main]

use std::path::Path;

use aether_controller::{Settings, Store, manifest, reconcile};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let parsed = manifest::parse(Path::new("fuzz.yaml"), &text);
    let store = Store::from_objects(parsed.objects);
    let settings = Settings {
        controller_name: "aether.io/edge".into(),
        address_pool: "127.0.1.0/28".parse().unwrap_or_else(|_| unreachable!()),
    };
    let outcome = reconcile(&store, &settings);
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
});
