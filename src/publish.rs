//! The publish step both sources share: a reconciled Snapshot goes to the listener
//! manager, and the statuses (bind failures folded in, transition times carried) go to
//! the admin server's `/status`.
//!
//! In Kubernetes mode a listener the new Snapshot drops lingers: it keeps serving what
//! it served for the linger (`--drain-delay`), because traffic keeps arriving until
//! every node's kube-proxy has the Service's new endpoints (a Gateway moved to pods of
//! its own, say), just as a terminating pod keeps accepting for its drain delay.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use aether_controller::Timestamp;
use aether_controller::manifest::ManifestError;
use aether_controller::{Outcome, Statuses};
use aether_proxy::{Listener, ListenerManager, Snapshot};
use metrics::{counter, gauge};
use tokio::time::Instant;

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
    /// While some socket fails to bind: when to try again, and the delay that led there.
    bind_retry: Option<(Instant, Duration)>,
    /// How long a dropped listener keeps serving; zero: it stops at once (standalone).
    linger: Duration,
    /// Dropped listeners still served, and until when.
    lingering: BTreeMap<SocketAddr, (Arc<Listener>, Instant)>,
}

/// The first retry of a failed bind comes this soon; each further one waits twice as
/// long, up to `BIND_RETRY_MAX`. A port held by another process is often freed within
/// seconds (an old edge draining), but may stay taken for hours.
pub const BIND_RETRY_FIRST: Duration = Duration::from_secs(1);
pub const BIND_RETRY_MAX: Duration = Duration::from_secs(30);

/// The delay before the next bind retry, after `previous` (none: the first failure).
fn next_bind_delay(previous: Option<Duration>) -> Duration {
    previous.map_or(BIND_RETRY_FIRST, |d| (d * 2).min(BIND_RETRY_MAX))
}

/// Waits until `at`; never, when there is nothing to wait for.
pub async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// What the last reconcile produced, before bind results were folded in.
struct Published {
    snapshot: Arc<Snapshot>,
    statuses: Statuses,
    errors: Arc<Vec<ManifestError>>,
    bind_failures: usize,
}

impl Publisher {
    /// `linger`: how long a listener a reconcile drops keeps serving (see above).
    pub fn new(manager: ListenerManager, admin: Arc<AdminState>, linger: Duration) -> Self {
        Self {
            manager,
            admin,
            generation: 0,
            current: None,
            statuses: Arc::default(),
            stamped_from: Statuses::default(),
            bind_retry: None,
            linger,
            lingering: BTreeMap::new(),
        }
    }

    /// Statuses as last published (bind failures and transition times included).
    pub fn statuses(&self) -> &Arc<Statuses> {
        &self.statuses
    }

    /// Publishes a new reconcile outcome; `errors` are the source's input errors.
    pub fn outcome(&mut self, outcome: Outcome, errors: Vec<ManifestError>) {
        let started = std::time::Instant::now();
        self.generation += 1;
        let mut snapshot = outcome.snapshot;
        snapshot.generation = self.generation;
        self.keep_lingering(&mut snapshot);
        counter!(aether_proxy::telemetry::CONFIG_RELOADS_TOTAL, "result" => if errors.is_empty() { "ok" } else { "partial" }).increment(1);
        // What the change cost: a full reconcile compiles every route, a change only
        // the routes it touched (or that name a Service whose endpoints changed).
        counter!(aether_proxy::telemetry::RECONCILE_ROUTES_COMPILED_TOTAL)
            .increment(outcome.redone.compiled as u64);
        counter!(aether_proxy::telemetry::RECONCILE_ROUTES_ATTACHED_TOTAL)
            .increment(outcome.redone.attached as u64);
        gauge!(aether_proxy::telemetry::CONFIG_GENERATION).set(self.generation as f64);
        aether_proxy::trim::after_large_change(outcome.redone.compiled);
        self.current = Some(Published {
            snapshot: Arc::new(snapshot),
            statuses: outcome.statuses,
            errors: Arc::new(errors),
            bind_failures: 0,
        });
        // A new configuration is a new attempt: its failures start a fresh backoff.
        self.bind_retry = None;
        self.publish(false);
        tracing::debug!(
            publish_us = started.elapsed().as_micros(),
            "configuration published"
        );
    }

    /// Brings listeners in line with the current Snapshot and publishes the statuses,
    /// with any sockets that could not be bound marked on their listeners.
    fn publish(&mut self, retry: bool) {
        let Some(current) = self.current.as_mut() else {
            return;
        };
        // Binds happen here, synchronously: once this returns, every socket the
        // Snapshot asks for is listening or reported as failing.
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
        // Ready from now on: a socket that failed to bind is in status and retried;
        // holding readiness back for it would leave every other listener unserved.
        self.admin
            .applied
            .store(true, std::sync::atomic::Ordering::Release);
        // A retry that changed nothing is not news; the listener manager logs binds.
        if !retry || failures.len() != current.bind_failures {
            tracing::info!(
                generation = self.generation,
                listeners = current.snapshot.listeners.len(),
                errors = current.errors.len(),
                bind_failures = failures.len(),
                "configuration applied"
            );
        }
        self.bind_retry = if failures.is_empty() {
            None
        } else {
            let delay = next_bind_delay(self.bind_retry.map(|(_, d)| d));
            Some((Instant::now() + delay, delay))
        };
        current.bind_failures = failures.len();
        self.statuses = statuses;
    }

    /// Adds to `next` the listeners the published Snapshot has and `next` drops, for
    /// the linger from when they were first dropped; one `next` serves again stops
    /// lingering (TCP only: a UDP socket's flows end with it).
    fn keep_lingering(&mut self, next: &mut Snapshot) {
        if self.linger.is_zero() {
            return;
        }
        let now = Instant::now();
        if let Some(published) = &self.current {
            for (addr, listener) in &published.snapshot.listeners {
                if !next.listeners.contains_key(addr) && !self.lingering.contains_key(addr) {
                    tracing::info!(%addr, linger = ?self.linger, "listener dropped; serving it for the linger while endpoints move");
                    self.lingering
                        .insert(*addr, (Arc::clone(listener), now + self.linger));
                }
            }
        }
        self.lingering
            .retain(|addr, (_, until)| *until > now && !next.listeners.contains_key(addr));
        for (addr, (listener, _)) in &self.lingering {
            next.listeners.insert(*addr, Arc::clone(listener));
        }
    }

    /// When `wake` is due: some socket failed to bind (typically a port still held by
    /// another process), or a lingering listener's time is up. None otherwise.
    pub fn wake_at(&self) -> Option<Instant> {
        let linger_ends = self.lingering.values().map(|(_, until)| *until).min();
        match (self.bind_retry.map(|(at, _)| at), linger_ends) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Stops lingering listeners whose time is up, and retries sockets that failed to
    /// bind, with backoff, until they bind or the configuration stops asking for them.
    /// True when it re-published.
    pub fn wake(&mut self) -> bool {
        let now = Instant::now();
        let ended: Vec<SocketAddr> = self
            .lingering
            .iter()
            .filter(|(_, (_, until))| *until <= now)
            .map(|(addr, _)| *addr)
            .collect();
        if let (false, Some(current)) = (ended.is_empty(), self.current.as_mut()) {
            let mut snapshot = Snapshot::clone(&current.snapshot);
            for addr in &ended {
                self.lingering.remove(addr);
                snapshot.listeners.remove(addr);
            }
            current.snapshot = Arc::new(snapshot);
            self.publish(false);
            return true;
        }
        if self.current.as_ref().is_some_and(|c| c.bind_failures > 0)
            && self.bind_retry.is_some_and(|(at, _)| at <= now)
        {
            self.publish(true);
            return true;
        }
        if self.bind_retry.is_some_and(|(at, _)| at <= now) {
            self.bind_retry = None;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_retries_back_off_from_one_second_to_thirty() {
        let mut delays = Vec::new();
        let mut d = None;
        for _ in 0..8 {
            let next = next_bind_delay(d);
            delays.push(next.as_secs());
            d = Some(next);
        }
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30, 30]);
    }
}
