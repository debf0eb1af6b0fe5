//! Comparing `/status` with a case's expectations.

use serde_json::Value;

use super::*;

// ---------------------------------------------------------------------------------------
// Status
// ---------------------------------------------------------------------------------------

pub(super) fn conditions_diffs(
    what: &str,
    conditions: &Value,
    want: &[CondExpect],
    out: &mut Vec<String>,
) {
    for c in want {
        let got = conditions
            .as_array()
            .and_then(|cs| cs.iter().find(|x| x["type"] == c.ctype.as_str()));
        let Some(got) = got else {
            out.push(format!(
                "{what}: expected condition {} {}{}, absent (conditions: {conditions})",
                c.ctype,
                c.status.as_str(),
                c.reason
                    .as_deref()
                    .map(|r| format!(" {r}"))
                    .unwrap_or_default()
            ));
            continue;
        };
        let status_ok = got["status"] == c.status.as_str();
        let reason_ok = c.reason.as_deref().is_none_or(|r| got["reason"] == r);
        if let Some(g) = c.observed_generation
            && got["observedGeneration"] != g
        {
            out.push(format!(
                "{what}: condition {}: expected observedGeneration {g}, got {}",
                c.ctype, got["observedGeneration"]
            ));
        }
        if !status_ok || !reason_ok {
            out.push(format!(
                "{what}: condition {}: expected {}{}, got {} {} ({:?})",
                c.ctype,
                c.status.as_str(),
                c.reason
                    .as_deref()
                    .map(|r| format!(" {r}"))
                    .unwrap_or_default(),
                got["status"].as_str().unwrap_or("?"),
                got["reason"].as_str().unwrap_or("?"),
                got["message"].as_str().unwrap_or("")
            ));
        }
    }
}

/// Whether a route's `status.parents[]` entry (or a policy's `status.ancestors[]`
/// entry) is for Gateway `ns/name`.
pub(super) fn parent_is(p: &Value, route_ns: &str, gw: &str) -> bool {
    let (ns, name) = split_ref(gw);
    let pr = if p.get("ancestorRef").is_some() {
        &p["ancestorRef"]
    } else {
        &p["parentRef"]
    };
    pr["name"] == name && pr["namespace"].as_str().unwrap_or(route_ns) == ns
}

pub(super) fn status_diffs(status: &Value, want: &[StatusExpect]) -> Vec<String> {
    let mut out = Vec::new();
    for w in want {
        let what = format!("{} {}/{}", w.kind, w.namespace, w.name);
        let item = match status_item(status, &w.kind, &w.namespace, &w.name) {
            Ok(i) => i,
            Err(e) => {
                out.push(format!("{what}: {e}"));
                continue;
            }
        };
        conditions_diffs(
            &what,
            &item["status"]["conditions"],
            &w.conditions,
            &mut out,
        );
        if let Some(n) = w.attached_listener_sets
            && item["status"]["attachedListenerSets"] != n
        {
            out.push(format!(
                "{what}: expected attachedListenerSets {n}, got {}",
                item["status"]["attachedListenerSets"]
            ));
        }
        if let Some(want) = &w.addresses {
            let got = gateway_addresses(item);
            if got != *want {
                out.push(format!("{what}: expected addresses {want:?}, got {got:?}"));
            }
        }
        if w.only_listed_listeners {
            let mut got: Vec<&str> = item["status"]["listeners"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|l| l["name"].as_str())
                .collect();
            let mut want: Vec<&str> = w.listeners.iter().map(|l| l.name.as_str()).collect();
            got.sort_unstable();
            want.sort_unstable();
            if got != want {
                out.push(format!(
                    "{what}: expected exactly listeners {want:?}, got {got:?}"
                ));
            }
        }
        for l in &w.listeners {
            let lwhat = format!("{what} listener {}", l.name);
            let Ok(got) = gateway_listener(item, &l.name) else {
                out.push(format!("{lwhat}: no listener status in {}", item["status"]));
                continue;
            };
            if let Some(n) = l.attached_routes
                && got["attachedRoutes"] != n
            {
                out.push(format!(
                    "{lwhat}: expected attachedRoutes {n}, got {}",
                    got["attachedRoutes"]
                ));
            }
            if let Some(kinds) = &l.supported_kinds {
                let mut want_k: Vec<&str> = kinds.iter().map(String::as_str).collect();
                let mut got_k: Vec<&str> = got["supportedKinds"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|k| k["kind"].as_str())
                    .collect();
                want_k.sort_unstable();
                got_k.sort_unstable();
                if want_k != got_k {
                    out.push(format!(
                        "{lwhat}: expected supportedKinds {want_k:?}, got {got_k:?}"
                    ));
                }
            }
            conditions_diffs(&lwhat, &got["conditions"], &l.conditions, &mut out);
        }
        let parents = item["status"]["parents"].as_array();
        let ancestors = item["status"]["ancestors"].as_array();
        for p in &w.ancestors {
            let awhat = format!("{what} ancestor {}", p.gateway);
            let found = ancestors
                .into_iter()
                .flatten()
                .find(|x| parent_is(x, &w.namespace, &p.gateway));
            let Some(found) = found else {
                out.push(format!(
                    "{awhat}: no such ancestor status; ancestors: {}",
                    item["status"]["ancestors"]
                ));
                continue;
            };
            conditions_diffs(&awhat, &found["conditions"], &p.conditions, &mut out);
        }
        for p in &w.parents {
            let pwhat = format!(
                "{what} parent {} {}{}{}",
                p.kind.as_deref().unwrap_or("Gateway"),
                p.gateway,
                p.section_name
                    .as_deref()
                    .map(|s| format!(" section {s}"))
                    .unwrap_or_default(),
                p.port.map(|s| format!(" port {s}")).unwrap_or_default()
            );
            let kind = p.kind.as_deref().unwrap_or("Gateway");
            let found = parents.into_iter().flatten().find(|x| {
                parent_is(x, &w.namespace, &p.gateway)
                    && x["parentRef"]["kind"].as_str().unwrap_or("Gateway") == kind
                    && x["parentRef"]["sectionName"].as_str() == p.section_name.as_deref()
                    && x["parentRef"]["port"].as_u64() == p.port.map(u64::from)
            });
            let Some(found) = found else {
                out.push(format!(
                    "{pwhat}: no such parent status; parents: {}",
                    item["status"]["parents"]
                ));
                continue;
            };
            conditions_diffs(&pwhat, &found["conditions"], &p.conditions, &mut out);
        }
        for g in &w.no_parents {
            if let Some(found) = parents
                .into_iter()
                .flatten()
                .find(|x| parent_is(x, &w.namespace, g))
            {
                out.push(format!(
                    "{what}: expected no parent status for {g}, got {found}"
                ));
            }
        }
    }
    out
}
