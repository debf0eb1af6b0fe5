//! A rule's `retry` (GEP-1731) and `timeouts` together: with retries, `request`
//! bounds all attempts and `backendRequest` each one; without, the shorter of the two
//! bounds the one attempt.

use std::time::Duration;

use aether_proxy::retry::{DEFAULT_ATTEMPTS, DEFAULT_BACKOFF, MAX_ATTEMPTS, RetryPolicy};

use crate::route_ext::RetrySpec;

/// The rule's overall deadline and its retry policy.
pub type Deadlines = (Option<Duration>, Option<Box<RetryPolicy>>);

/// `request` and `backendRequest` are already parsed (zero: none) and checked against
/// each other.
pub fn compile(
    retry: Option<&Result<RetrySpec, String>>,
    request: Option<Duration>,
    backend_request: Option<Duration>,
) -> Result<Deadlines, String> {
    let shorter = match (request, backend_request) {
        (Some(r), Some(b)) => Some(r.min(b)),
        (r, b) => r.or(b),
    };
    let Some(spec) = retry else {
        return Ok((shorter, None));
    };
    let spec = spec.as_ref().map_err(Clone::clone)?;
    let attempts = match spec.attempts {
        None => DEFAULT_ATTEMPTS,
        Some(n) => u32::try_from(n)
            .ok()
            .filter(|n| *n <= MAX_ATTEMPTS)
            .ok_or_else(|| format!("retry attempts {n} is not within 0-{MAX_ATTEMPTS}"))?,
    };
    let mut codes = Vec::new();
    for &c in spec.codes.iter().flatten() {
        let code = u16::try_from(c)
            .ok()
            .filter(|c| (400..=599).contains(c))
            .ok_or_else(|| format!("retry code {c} is not within 400-599"))?;
        if !codes.contains(&code) {
            codes.push(code);
        }
    }
    let backoff = match spec.backoff.as_deref() {
        None => DEFAULT_BACKOFF,
        Some(v) => {
            let d: gateway_api::Duration = v
                .parse()
                .map_err(|e| format!("invalid retry backoff {v:?}: {e}"))?;
            Duration::from_nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        }
    };
    if attempts == 0 {
        // An explicit zero disables retries, the connect retry included.
        let policy = RetryPolicy {
            attempts,
            codes: Vec::new(),
            backoff,
            attempt_timeout: None,
        };
        return Ok((shorter, Some(Box::new(policy))));
    }
    let policy = RetryPolicy {
        attempts,
        codes,
        backoff,
        attempt_timeout: backend_request,
    };
    Ok((request, Some(Box::new(policy))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(codes: &[i64], attempts: Option<i64>, backoff: Option<&str>) -> RetrySpec {
        RetrySpec {
            codes: Some(codes.to_vec()),
            attempts,
            backoff: backoff.map(Into::into),
        }
    }

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn request_bounds_all_attempts_and_backend_request_each() {
        let s = Ok(spec(&[500, 500, 503], Some(3), Some("100ms")));
        let (total, policy) = compile(Some(&s), Some(MS(400)), Some(MS(200))).unwrap();
        assert_eq!(total, Some(MS(400)));
        let p = policy.unwrap();
        assert_eq!((p.attempts, p.codes.as_slice()), (3, &[500, 503][..]));
        assert_eq!((p.backoff, p.attempt_timeout), (MS(100), Some(MS(200))));
    }

    #[test]
    fn without_retries_the_shorter_timeout_bounds_the_one_attempt() {
        assert_eq!(
            compile(None, Some(MS(400)), Some(MS(200))).unwrap(),
            (Some(MS(200)), None)
        );
        let zero = Ok(spec(&[500], Some(0), None));
        let (total, policy) = compile(Some(&zero), Some(MS(400)), Some(MS(200))).unwrap();
        assert_eq!(total, Some(MS(200)));
        assert_eq!(policy.unwrap().attempts, 0);
        let defaults = Ok(RetrySpec::default());
        let p = compile(Some(&defaults), None, None).unwrap().1.unwrap();
        assert_eq!((p.attempts, p.backoff), (DEFAULT_ATTEMPTS, DEFAULT_BACKOFF));
    }

    #[test]
    fn out_of_range_values_make_the_rule_invalid() {
        for bad in [
            spec(&[200], None, None),
            spec(&[600], None, None),
            spec(&[], Some(-1), None),
            spec(&[], Some(1000), None),
            spec(&[], None, Some("soon")),
        ] {
            assert!(
                compile(Some(&Ok(bad.clone())), None, None).is_err(),
                "{bad:?}"
            );
        }
        assert!(compile(Some(&Err("invalid retry".into())), None, None).is_err());
    }
}
