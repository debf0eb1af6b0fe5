//! The publish step both sources share: a reconciled Snapshot goes to the listener
//! manager, and the statuses (bind failures folded in, transition times carried) go to
//! the admin server's `/status`.

use std::sync::Arc;

use aether_controller::Timestamp;
use aether_controller::manifest::ManifestError;
use aether_controller::{Outcome, Statuses};
use aether_proxy::{ListenerManager, Snapshot};
use metrics::{counter, gauge};

use crate::admin::{AdminState, StatusDoc};

pub struct Publisher {
    pub manager: ListenerManager,
    admin: Arc<AdminState>,
    generation: u64,
    /// The last reconcile, kept to re-publish when a failed bind is retried.
    current: Option<Published>,
    /// Statuses as last published, for carrying condition transition times.
    statuses: Arc<Statuses>,
    /// What those were stamped from: a status the reconciler hands out again unchanged
    /// is published again as it was.
    stamped_from: Statuses,
}

/// What the last reconcile produced, before bind results were folded in.
struct Published {
    snapshot: Arc<Snapshot>,
    statuses: Statuses,
    errors: Arc<Vec<ManifestError>>,
    bind_failures: usize,
}

impl Publisher {
    pub fn new(manager: ListenerManager, admin: Arc<AdminState>) -> Self {
        Self {
            manager,
            admin,
            generation: 0,
            current: None,
            statuses: Arc::default(),
            stamped_from: Statuses::default(),
        }
    }

    /// Statuses as last published (bind failures and transition times included).
    pub fn statuses(&self) -> &Arc<Statuses> {
        &self.statuses
    }

    /// Publishes a new reconcile outcome; `errors` are the source's input errors.
    pub fn outcome(&mut self, outcome: Outcome, errors: Vec<ManifestError>) {
        self.generation += 1;
        let mut snapshot = outcome.snapshot;
        snapshot.generation = self.generation;
        counter!("aether_config_reloads_total", "result" => if errors.is_empty() { "ok" } else { "partial" }).increment(1);
        gauge!("aether_config_generation").set(self.generation as f64);
        self.current = Some(Published {
            snapshot: Arc::new(snapshot),
            statuses: outcome.statuses,
            errors: Arc::new(errors),
            bind_failures: 0,
        });
        self.publish();
    }

    /// Brings listeners in line with the current Snapshot and publishes the statuses,
    /// with any sockets that could not be bound marked on their listeners.
    fn publish(&mut self) {
        let Some(current) = self.current.as_mut() else {
            return;
        };
        let failures = self.manager.apply(Arc::clone(&current.snapshot));
        let mut statuses = current.statuses.clone();
        statuses.mark_bind_failures(&current.snapshot, &failures);
        let input = statuses.clone();
        statuses.carry_transition_times(&self.stamped_from, &self.statuses, Timestamp::now());
        self.stamped_from = input;
        let statuses = Arc::new(statuses);
        self.admin.status.store(Arc::new(StatusDoc {
            statuses: Arc::clone(&statuses),
            errors: Arc::clone(&current.errors),
        }));
        tracing::info!(
            generation = self.generation,
            listeners = current.snapshot.listeners.len(),
            errors = current.errors.len(),
            bind_failures = failures.len(),
            "configuration applied"
        );
        current.bind_failures = failures.len();
        self.statuses = statuses;
    }

    /// Sockets that failed to bind (typically a port still held by another process)
    /// are retried until they bind or the configuration stops asking for them. True
    /// when it re-published.
    pub fn retry_binds(&mut self) -> bool {
        if self.current.as_ref().is_some_and(|c| c.bind_failures > 0) {
            self.publish();
            return true;
        }
        false
    }
}
