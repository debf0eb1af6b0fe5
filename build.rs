//! Lays the release executable's code out in the order a run of the edge executed it.
//!
//! An idle edge touches a few MiB of its 30 MB of code, but spread over the whole text
//! section; the kernel maps 64 KiB or more around every page fault, so scattered code
//! made the executable two thirds of the idle process's resident memory. Functions
//! listed in `link-order.txt` (made by `benches/scale/link-order.sh` from an
//! instrumented run) are placed first and together. Names are the linker's, so the
//! list fits one toolchain and lock file; a stale list costs nothing but the benefit
//! (the linker ignores names it does not find).
//!
//! The same links pack the executable's relative relocations (`-z
//! pack-relative-relocs`, DT_RELR): as a position-independent executable it has about
//! 24,000 of them, 570 KiB of `.rela.dyn` that the loader reads whole at every start
//! and that then stayed resident; packed, they are a few KiB. It needs glibc 2.36 or
//! later where the edge runs (Debian 12, the image's base, has it).

use std::env;
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=link-order.txt");
    println!("cargo:rerun-if-env-changed=AETHER_LINK_ORDER");
    let list =
        Path::new(&env::var("CARGO_MANIFEST_DIR").unwrap_or_default()).join("link-order.txt");
    let wanted = env::var("AETHER_LINK_ORDER").as_deref() != Ok("0");
    // The names are only ever those of an optimised build; debug builds skip it.
    let optimised = env::var("PROFILE").is_ok_and(|p| p == "release");
    if !(optimised && links_with_lld()) {
        return;
    }
    let bin = "cargo:rustc-link-arg-bin=aether-edge";
    println!("{bin}=-Wl,-z,pack-relative-relocs");
    if !(wanted && list.is_file()) {
        return;
    }
    println!("{bin}=-Wl,--symbol-ordering-file={}", list.display());
    println!("{bin}=-Wl,--no-warn-symbol-ordering");
}

/// Whether the link goes through LLD, the only linker here that takes a symbol order:
/// rustc's default on x86_64 Linux (since 1.90) unless a linker is configured.
fn links_with_lld() -> bool {
    let target = env::var("TARGET").unwrap_or_default();
    let flags = env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    let linker_env = format!(
        "CARGO_TARGET_{}_LINKER",
        target.to_uppercase().replace(['-', '.'], "_")
    );
    println!("cargo:rerun-if-env-changed={linker_env}");
    target == "x86_64-unknown-linux-gnu"
        && !flags.contains("linker")
        && env::var_os(linker_env).is_none()
}
