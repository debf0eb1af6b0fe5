//! The echo backend's retry simulation, as the Gateway API conformance suite's
//! echo-basic server offers it for the HTTPRoute retry tests: a request whose query
//! has `uuid=U&responseCode=C&succeedAfter=N` is answered with status C (after
//! `delayRetry`, e.g. `300ms`, if given) while fewer than N requests with that uuid
//! came before it, and normally after that. Every answer to a request with a `uuid`
//! carries `x-echo-attempt: K`, the count of requests with that uuid so far, so a test
//! sees how many attempts actually reached the backend.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use http::StatusCode;

/// Uuids remembered at most; beyond that the table starts afresh (tests use a few).
const MAX_TRACKED: usize = 10_000;

pub const ATTEMPT_HEADER: &str = "x-echo-attempt";

#[derive(Default)]
pub struct RetrySim {
    // Held only to count, never across an await.
    seen: Mutex<HashMap<String, u32>>,
}

/// What the simulation says about one request.
pub struct Verdict {
    /// 1-based count of requests with this uuid, this one included.
    pub attempt: u32,
    /// Answer this status instead of the echo, after this delay.
    pub fail: Option<(StatusCode, Option<Duration>)>,
}

impl RetrySim {
    /// `None` for a request that does not take part (no `uuid` in its query).
    pub fn check(&self, query: Option<&str>) -> Option<Verdict> {
        let mut uuid = None;
        let mut code = None;
        let mut succeed_after = 0u32;
        let mut delay = None;
        for (k, v) in query?.split('&').filter_map(|kv| kv.split_once('=')) {
            match k {
                "uuid" => uuid = Some(v),
                "responseCode" => code = v.parse::<u16>().ok(),
                "succeedAfter" => succeed_after = v.parse().unwrap_or(0),
                "delayRetry" => delay = humantime::parse_duration(v).ok(),
                _ => {}
            }
        }
        let uuid = uuid?;
        let attempt = {
            let mut seen = self
                .seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if seen.len() >= MAX_TRACKED && !seen.contains_key(uuid) {
                seen.clear();
            }
            let n = seen.entry(uuid.to_owned()).or_default();
            *n += 1;
            *n
        };
        let fail = code
            .and_then(|c| StatusCode::from_u16(c).ok())
            .filter(|_| attempt <= succeed_after)
            .map(|c| (c, delay.map(|d| d.min(Duration::from_secs(60)))));
        Some(Verdict { attempt, fail })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fails_the_first_n_requests_of_a_uuid_then_succeeds() {
        let sim = RetrySim::default();
        let q = Some("uuid=a&responseCode=503&succeedAfter=2&delayRetry=10ms");
        let codes: Vec<_> = (0..3)
            .filter_map(|_| sim.check(q))
            .map(|v| (v.attempt, v.fail.map(|f| f.0.as_u16())))
            .collect();
        assert_eq!(codes, vec![(1, Some(503)), (2, Some(503)), (3, None)]);
        let other = sim.check(Some("uuid=b&responseCode=500&succeedAfter=1"));
        assert_eq!(other.map(|v| v.attempt), Some(1));
        assert!(sim.check(Some("responseCode=500")).is_none());
        assert!(sim.check(None).is_none());
    }
}
