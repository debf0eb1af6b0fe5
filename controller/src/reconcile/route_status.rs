//! An HTTPRoute's or GRPCRoute's status as attaching decided it, before it is built.
//!
//! Routes attached alike (same parents, accepted, references resolved, same generation)
//! report equal statuses, and building each route's only to find it equal to one
//! already shared allocated a dozen strings per route: a first load of 10,000 routes
//! spent a fifth of its attachment time there. The decision borrows its strings from
//! the route and its model, is compared with the statuses kept, and is built only when
//! none matches.

use std::collections::VecDeque;
use std::sync::Arc;

use gateway_api::httproutes::{
    HttpRouteParentRefs, HttpRouteStatus, HttpRouteStatusParents, HttpRouteStatusParentsParentRef,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::backend::RefProblem;
use super::conditions::Decided;
use super::gateway::GATEWAY_GROUP;
use super::parent::ParentTarget;

/// What attaching decided for one parentRef of ours.
pub(super) struct ParentDecision<'a> {
    pub parent: &'a HttpRouteParentRefs,
    pub target: ParentTarget,
    pub accepted: Decided<'a>,
    pub refs: Decided<'a>,
    pub partially_invalid: Option<Decided<'a>>,
}

impl ParentDecision<'_> {
    fn conditions(&self) -> impl Iterator<Item = &Decided<'_>> {
        [Some(&self.accepted), Some(&self.refs)]
            .into_iter()
            .chain([self.partially_invalid.as_ref()])
            .flatten()
    }

    fn build(&self, controller_name: &str) -> HttpRouteStatusParents {
        let conditions = self.conditions().map(Decided::build).collect();
        parent_status(controller_name, self.parent, &self.target, conditions)
    }

    /// Is `built` what [`ParentDecision::build`] would build? Destructured, so a field
    /// the type gains fails to compile here rather than compare as equal.
    fn is(&self, controller_name: &str, built: &HttpRouteStatusParents) -> bool {
        let HttpRouteStatusParents {
            conditions,
            controller_name: controller,
            parent_ref:
                HttpRouteStatusParentsParentRef {
                    group,
                    kind,
                    name,
                    namespace,
                    port,
                    section_name,
                },
        } = built;
        let (reported_kind, key) = self.target.reported();
        controller == controller_name
            && group.as_deref() == Some(GATEWAY_GROUP)
            && kind.as_deref() == Some(reported_kind)
            && *name == self.parent.name
            && namespace.as_deref() == Some(key.namespace())
            && *port == self.parent.port
            && *section_name == self.parent.section_name
            && conditions.len() == self.conditions().count()
            && self.conditions().zip(conditions).all(|(d, c)| d.is(c))
    }
}

/// One `status.parents` entry for a Gateway or ListenerSet parent, with the
/// parentRef's defaults filled in as the API server's CRD defaulting would, so the
/// status reads the same in standalone and Kubernetes mode.
pub(super) fn parent_status(
    controller_name: &str,
    parent: &HttpRouteParentRefs,
    target: &ParentTarget,
    conditions: Vec<Condition>,
) -> HttpRouteStatusParents {
    let (kind, key) = target.reported();
    HttpRouteStatusParents {
        conditions,
        controller_name: controller_name.to_owned(),
        parent_ref: HttpRouteStatusParentsParentRef {
            group: Some(GATEWAY_GROUP.to_owned()),
            kind: Some(kind.to_owned()),
            name: parent.name.clone(),
            namespace: Some(key.namespace().to_string()),
            port: parent.port,
            section_name: parent.section_name.clone(),
        },
    }
}

/// ResolvedRefs from a route's first backendRef problem.
pub(super) fn refs_decided(generation: i64, refs: &Result<(), Box<RefProblem>>) -> Decided<'_> {
    match refs {
        Ok(()) => Decided::resolved_refs(generation),
        Err(p) => Decided::unresolved_refs(generation, p.reason, &p.message),
    }
}

/// Statuses recently reported, to share. A status names no route: routes attached
/// alike report equal ones, and 5,000 copies of one status were 2 MiB of the
/// reconciler's memo (and as much again in the publisher's stamped copy, which shares
/// when its input does). The last few distinct ones catch runs of alike routes at a few
/// comparisons per attach; holding them keeps at most that many statuses alive after
/// their routes go.
#[derive(Default)]
pub(super) struct SharedStatuses(VecDeque<Arc<HttpRouteStatus>>);

impl SharedStatuses {
    const KEPT: usize = 8;

    /// The status `parents` decide: one kept if equal, else built and kept for the next
    /// routes.
    pub fn share(
        &mut self,
        parents: &[ParentDecision<'_>],
        controller_name: &str,
    ) -> Arc<HttpRouteStatus> {
        let is = |s: &HttpRouteStatus| {
            s.parents.len() == parents.len()
                && parents
                    .iter()
                    .zip(&s.parents)
                    .all(|(d, p)| d.is(controller_name, p))
        };
        if let Some(same) = self.0.iter().find(|s| is(s)) {
            debug_assert!(**same == build(parents, controller_name));
            return Arc::clone(same);
        }
        let status = Arc::new(build(parents, controller_name));
        debug_assert!(is(&status), "a decision must match what it builds");
        if self.0.len() == Self::KEPT {
            self.0.pop_back();
        }
        self.0.push_front(Arc::clone(&status));
        status
    }
}

fn build(parents: &[ParentDecision<'_>], controller_name: &str) -> HttpRouteStatus {
    HttpRouteStatus {
        parents: parents.iter().map(|p| p.build(controller_name)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::store::ObjectKey;
    use crate::testing;

    const WORLD: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: aether}
spec: {controllerName: aether.io/edge}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: default}
spec:
  gatewayClassName: aether
  listeners:
  - {name: a, port: 8080, protocol: HTTP}
  - {name: b, port: 8081, protocol: HTTP}
---
apiVersion: v1
kind: Service
metadata: {name: svc, namespace: default}
spec: {ports: [{name: http, port: 80}]}
"#;

    /// Route `name` with `parent` (a parentRef's flow mapping) and `backend` (the
    /// Service it names).
    fn route(name: &str, generation: i64, parent: &str, backend: &str) -> String {
        format!(
            "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n\
             metadata: {{name: {name}, namespace: default, generation: {generation}}}\n\
             spec: {{parentRefs: [{parent}], rules: [{{backendRefs: [{{name: {backend}, port: 80}}]}}]}}\n"
        )
    }

    #[test]
    fn alike_routes_share_a_status_and_any_difference_builds_its_own() {
        let routes = [
            route("r1", 1, "{name: gw}", "svc"),
            route("r2", 1, "{name: gw}", "svc"),
            route("r3", 2, "{name: gw}", "svc"),
            route("r4", 1, "{name: gw, sectionName: a}", "svc"),
            route("r5", 1, "{name: gw, sectionName: b}", "svc"),
            route("r6", 1, "{name: gw}", "missing"),
            route("r7", 1, "{name: gw, sectionName: c}", "svc"),
            route("r8", 1, "{name: gw}", "svc"),
        ];
        let out = testing::outcome(&format!("{WORLD}{}", routes.concat()));
        let status = |name: &str| {
            let s = &out.statuses.http_routes[&ObjectKey::new("default", name)];
            Arc::clone(&s.status)
        };
        // Equal decisions: one status, shared.
        assert!(Arc::ptr_eq(&status("r1"), &status("r2")));
        assert!(Arc::ptr_eq(&status("r1"), &status("r8")));
        // A generation, a sectionName, a backend problem, a refusal: each its own,
        // and each what that route's decision says.
        for other in ["r3", "r4", "r5", "r6", "r7"] {
            assert_ne!(*status("r1"), *status(other), "{other}");
        }
        let conds = |name: &str| status(name).parents[0].conditions.clone();
        assert_eq!(conds("r3")[0].observed_generation, Some(2));
        let r5 = status("r5");
        assert_eq!(r5.parents[0].parent_ref.section_name.as_deref(), Some("b"));
        assert_eq!(testing::condition(&conds("r6"), "ResolvedRefs").0, "False");
        assert_eq!(testing::condition(&conds("r6"), "Accepted").0, "True");
        let r7 = conds("r7");
        assert_eq!(
            testing::condition(&r7, "Accepted"),
            ("False", "NoMatchingParent")
        );
        assert_eq!(
            r7[0].message,
            "no listener matches the parentRef's sectionName and port"
        );
        assert_eq!(conds("r1")[0].message, "HTTPRoute is accepted");
    }
}
