//! Arbitrary bytes through the HTTP/1.1 relay's parsers (`proxy/src/relay/`): the end
//! of a chunked body does not depend on how its bytes arrive; an answer head the relay
//! accepts is written back as a valid head with one request ID and no Content-Length
//! beside Transfer-Encoding; a request head it takes goes upstream as a valid head with
//! the same method and target and no hop-by-hop or client-set forwarding headers.

#![no_main]

use aether_proxy::relay_fuzzing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let cut = data.first().map_or(0, |&b| usize::from(b));
    relay_fuzzing::chunked(data, cut);
    relay_fuzzing::answer(data);
    relay_fuzzing::request(data);
});
