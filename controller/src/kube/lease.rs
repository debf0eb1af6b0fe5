//! One writer at a time: a coordination.k8s.io Lease decides which replica writes
//! status and Gateway Services.
//!
//! Replicas of one version compute the same bytes, so several writers would only
//! repeat each other. During a rolling upgrade, though, two versions may compute
//! different status, and two writers would then flip it back and forth. Only the
//! Lease holder writes; every replica still watches, reconciles and serves traffic,
//! so the data plane never waits on the Lease. A holder that stops renewing loses it
//! after `duration`, and another replica takes over.
//!
//! A replica that shuts down releases the Lease at once ([`Lease::release`]): it
//! stops reconciling when it starts to drain, so as a holder it would leave every
//! Gateway's endpoints as they were (its own draining pod, and any other pod the
//! rollout stops meanwhile, still listed) until the Lease expired. Candidates ask
//! every [`CANDIDATE_RETRY`] at most, so a released Lease changes hands within that.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease as LeaseObject, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use metrics::gauge;
use tokio::sync::{oneshot, watch};

/// How often a replica that does not hold the Lease asks for it (at most; holders
/// renew every third of the duration): the longest a released Lease waits for its
/// next holder.
pub const CANDIDATE_RETRY: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// Who we are in `holderIdentity`: the pod name in a cluster.
    pub identity: String,
    /// How long a holder keeps the Lease without renewing; renewals come at a third.
    pub duration: Duration,
}

/// This replica's part in the writer Lease: whether it holds it now, and the way to
/// give it up.
pub struct Lease {
    /// True while this replica holds the Lease.
    pub held: watch::Receiver<bool>,
    release: oneshot::Sender<oneshot::Sender<()>>,
}

impl Lease {
    /// Stops contending and, if held, gives the Lease up in the API server (holder
    /// cleared) so another replica takes it at its next try instead of after
    /// `duration`. Waits at most `limit` for the write; `held` turns false first.
    pub async fn release(self, limit: Duration) {
        let (done_tx, done_rx) = oneshot::channel();
        if self.release.send(done_tx).is_ok() {
            let _ = tokio::time::timeout(limit, done_rx).await;
        }
    }
}

/// Keeps trying to hold the Lease until released.
pub fn spawn(client: Client, config: LeaseConfig) -> Lease {
    let (tx, rx) = watch::channel(false);
    let (release_tx, mut release_rx) = oneshot::channel::<oneshot::Sender<()>>();
    tokio::spawn(async move {
        let api = Api::<LeaseObject>::namespaced(client, &config.namespace);
        let renew = config.duration / 3;
        // When we last renewed successfully: a holder that can't renew for a whole
        // duration must assume another replica took over.
        let mut renewed: Option<tokio::time::Instant> = None;
        loop {
            let held = match try_hold(&api, &config).await {
                Ok(held) => {
                    renewed = held.then(tokio::time::Instant::now);
                    held
                }
                Err(e) => {
                    tracing::warn!(lease = %config.name, error = %e, "cannot read or renew the writer Lease; retrying");
                    renewed.is_some_and(|t| t.elapsed() < config.duration)
                }
            };
            if *tx.borrow() != held {
                tracing::info!(lease = %config.name, identity = %config.identity, held, "writer Lease {}", if held { "acquired" } else { "lost" });
            }
            gauge!(aether_proxy::telemetry::WRITER_LEASE_HELD).set(if held { 1.0 } else { 0.0 });
            tx.send_replace(held);
            let wait = if held {
                renew
            } else {
                renew.min(CANDIDATE_RETRY)
            };
            tokio::select! {
                r = &mut release_rx => {
                    // Writers are told to stop before the Lease is given up, so the
                    // next holder does not start while this one still means to write.
                    tx.send_replace(false);
                    gauge!(aether_proxy::telemetry::WRITER_LEASE_HELD).set(0.0);
                    if held {
                        match give_up(&api, &config).await {
                            Ok(true) => tracing::info!(lease = %config.name, identity = %config.identity, "writer Lease released"),
                            Ok(false) => {}
                            Err(e) => tracing::warn!(lease = %config.name, error = %e, "cannot release the writer Lease; it expires after its duration"),
                        }
                    }
                    if let Ok(done) = r {
                        let _ = done.send(());
                    }
                    return;
                }
                () = tokio::time::sleep(wait) => {}
            }
        }
    });
    Lease {
        held: rx,
        release: release_tx,
    }
}

/// Clears the holder, if it is still us (as client-go's leader election does on
/// release: no holder, a one-second duration). True if it was ours to clear.
async fn give_up(api: &Api<LeaseObject>, config: &LeaseConfig) -> Result<bool, kube::Error> {
    let Some(mut lease) = api.get_opt(&config.name).await? else {
        return Ok(false);
    };
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if spec.holder_identity.as_deref() != Some(config.identity.as_str()) {
        return Ok(false);
    }
    let now = MicroTime(Timestamp::now());
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(now.clone());
    spec.acquire_time = Some(now);
    // A conflict: someone wrote it since we read it, so it is not ours to clear.
    write(api, config, &lease).await
}

/// One round: create, renew or take over the Lease. True if we hold it afterwards.
/// Every write carries the read's resourceVersion, so two replicas racing for an
/// expired Lease can't both win: the loser gets a conflict and reads again.
async fn try_hold(api: &Api<LeaseObject>, config: &LeaseConfig) -> Result<bool, kube::Error> {
    let now = Timestamp::now();
    let seconds = i32::try_from(config.duration.as_secs().max(1)).unwrap_or(i32::MAX);
    let Some(mut lease) = api.get_opt(&config.name).await? else {
        let lease = LeaseObject {
            metadata: ObjectMeta {
                name: Some(config.name.clone()),
                namespace: Some(config.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(config.identity.clone()),
                lease_duration_seconds: Some(seconds),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    let ours = spec.holder_identity.as_deref() == Some(config.identity.as_str());
    // No holder: released, free to take at once.
    let free = spec.holder_identity.as_deref().is_none_or(str::is_empty);
    let expired = free
        || match (&spec.renew_time, spec.lease_duration_seconds) {
            (Some(MicroTime(t)), Some(d)) => {
                now.duration_since(*t) > SignedDuration::from_secs(i64::from(d))
            }
            _ => true,
        };
    if !ours && !expired {
        return Ok(false);
    }
    if !ours {
        spec.holder_identity = Some(config.identity.clone());
        spec.acquire_time = Some(MicroTime(now));
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    }
    spec.renew_time = Some(MicroTime(now));
    spec.lease_duration_seconds = Some(seconds);
    write(api, config, &lease).await
}

/// Replaces the Lease as read (its resourceVersion is the precondition). True if it
/// was written; false on a conflict, which means another replica wrote it first.
async fn write(
    api: &Api<LeaseObject>,
    config: &LeaseConfig,
    lease: &LeaseObject,
) -> Result<bool, kube::Error> {
    match api
        .replace(&config.name, &PostParams::default(), lease)
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Waits until we hold the Lease. False if the Lease task is gone.
pub async fn until_held(held: &mut watch::Receiver<bool>) -> bool {
    held.wait_for(|h| *h).await.is_ok()
}

/// Waits for news for a writer: a new desired value, or a change of Lease holder (a
/// new holder must write at once what the old one may have left unwritten). False
/// when either sender is gone.
pub async fn news<T>(rx: &mut watch::Receiver<T>, held: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        r = rx.changed() => r.is_ok(),
        r = held.changed() => r.is_ok(),
    }
}
