//! aether-controller: the Gateway API side of aether-edge.
//!
//! Sources fill a [`Store`]; [`reconcile`] turns it, purely, into the proxy's
//! [`aether_proxy::Snapshot`] and the [`Statuses`] every object should carry.

pub mod compact;
pub mod gateway_ext;
pub mod grpc_route;
#[cfg(feature = "kubernetes")]
pub mod kube;
pub mod l4route;
pub mod manifest;
pub mod reconcile;
pub mod route_ext;
pub mod route_match;
pub mod status;
pub mod store;
pub mod tls_secret;

#[cfg(test)]
pub(crate) mod testing;

pub use k8s_openapi::jiff::Timestamp;
pub use reconcile::{Outcome, Reconciler, Settings, reconcile};
pub use status::Statuses;
pub use store::{Object, ObjectKey, Store};
