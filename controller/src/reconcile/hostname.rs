//! Listener and route hostname intersection, as the spec defines it.

/// Does `host` (exact or `*.` wildcard) fall within `pattern` (exact or wildcard)?
/// A wildcard matches one or more labels in front of its suffix, never the bare suffix.
pub fn within(host: &str, pattern: &str) -> bool {
    fn ends_with(h: &str, suffix: &str) -> bool {
        h.len() >= suffix.len()
            && h.get(h.len() - suffix.len()..)
                .is_some_and(|tail| tail.eq_ignore_ascii_case(suffix))
    }
    match (host.strip_prefix('*'), pattern.strip_prefix('*')) {
        (_, None) => host.eq_ignore_ascii_case(pattern),
        (None, Some(suffix)) => host.len() > suffix.len() && ends_with(host, suffix),
        (Some(host_suffix), Some(suffix)) => ends_with(host_suffix, suffix),
    }
}

/// The hostname two hostnames have in common: the more specific of the two when one
/// lies within the other. `None` means they do not intersect.
pub fn intersect<'a>(listener: &'a str, route: &'a str) -> Option<&'a str> {
    if within(route, listener) {
        Some(route)
    } else if within(listener, route) {
        Some(listener)
    } else {
        None
    }
}

/// Is listener hostname `a` more specific than `b` (`None`: no hostname)? Of two
/// listener hostnames that can match one request, one always lies within the other.
pub fn more_specific(a: Option<&str>, b: Option<&str>) -> bool {
    match (a, b) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(a), Some(b)) => within(a, b) && !a.eq_ignore_ascii_case(b),
    }
}

/// The hostnames a route serves on a listener. `Some(vec![None])` means "any host";
/// `None` means the route and listener share no hostname.
pub fn effective<H: AsRef<str>>(
    listener: Option<&str>,
    route: &[H],
) -> Option<Vec<Option<String>>> {
    match (listener, route.is_empty()) {
        (None, true) => Some(vec![None]),
        (Some(l), true) => Some(vec![Some(l.to_ascii_lowercase())]),
        (None, false) => Some(
            route
                .iter()
                .map(|h| Some(h.as_ref().to_ascii_lowercase()))
                .collect(),
        ),
        (Some(l), false) => {
            let mut out: Vec<Option<String>> = route
                .iter()
                .filter_map(|h| intersect(l, h.as_ref()))
                .map(|h| Some(h.to_ascii_lowercase()))
                .collect();
            out.sort();
            out.dedup();
            (!out.is_empty()).then_some(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intersection_takes_the_more_specific_name() {
        assert_eq!(
            intersect("foo.example.com", "foo.example.com"),
            Some("foo.example.com")
        );
        assert_eq!(
            intersect("*.example.com", "foo.example.com"),
            Some("foo.example.com")
        );
        assert_eq!(
            intersect("*.example.com", "a.b.example.com"),
            Some("a.b.example.com")
        );
        assert_eq!(
            intersect("foo.example.com", "*.example.com"),
            Some("foo.example.com")
        );
        assert_eq!(
            intersect("*.example.com", "*.a.example.com"),
            Some("*.a.example.com")
        );
        assert_eq!(
            intersect("*.a.example.com", "*.example.com"),
            Some("*.a.example.com")
        );
        assert_eq!(
            intersect("*.example.com", "*.example.com"),
            Some("*.example.com")
        );
        assert_eq!(intersect("*.example.com", "example.com"), None);
        assert_eq!(intersect("foo.example.com", "bar.example.com"), None);
        assert_eq!(intersect("*.example.com", "foo.example.net"), None);
    }

    #[test]
    fn effective_hostnames_drop_non_matching_route_names() {
        let route = vec!["test.example.com".to_owned(), "test.example.net".to_owned()];
        assert_eq!(
            effective(Some("*.example.com"), &route),
            Some(vec![Some("test.example.com".to_owned())])
        );
        assert_eq!(effective(Some("a.org"), &route), None);
        assert_eq!(effective::<String>(None, &[]), Some(vec![None]));
    }

    #[test]
    fn specificity_orders_nested_listener_hostnames() {
        assert!(more_specific(Some("*.example.com"), None));
        assert!(more_specific(
            Some("*.foo.example.com"),
            Some("*.example.com")
        ));
        assert!(more_specific(
            Some("abc.foo.example.com"),
            Some("*.foo.example.com")
        ));
        assert!(!more_specific(Some("*.example.com"), Some("*.example.com")));
        assert!(!more_specific(
            Some("*.example.com"),
            Some("*.foo.example.com")
        ));
        assert!(!more_specific(None, None));
    }
}
