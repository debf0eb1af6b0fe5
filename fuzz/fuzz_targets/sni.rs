//! Arbitrary bytes through the TLS passthrough SNI reader: no panic, and a complete
//! answer is stable: every shorter prefix of an input that parses to a name (or to
//! "no name") only asks for more bytes, so the reader never decides early.

#![no_main]

use aether_proxy::l4::sni::{Hello, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let full = parse(data);
    if matches!(full, Hello::ServerName(_) | Hello::NoServerName) {
        // A few cut points keep each run fast; libFuzzer varies the input anyway.
        for cut in [0, 1, 5, data.len() / 2, data.len().saturating_sub(1)] {
            if cut < data.len() {
                let prefix = parse(&data[..cut]);
                assert!(
                    prefix == Hello::NeedMore || prefix == full,
                    "prefix {cut}: {prefix:?} vs {full:?}"
                );
            }
        }
    }
    if let Hello::ServerName(name) = full {
        assert!(!name.is_empty() && name.len() <= 253);
    }
});
