//! The five C math functions the edge's dependencies call, defined by the executable
//! itself so it does not load glibc's libm for them. Only the Prometheus exporter and
//! `metrics-util`'s summaries (`exp`, `log`, `log1p`, `log2`) and tokio's poll-time
//! average (`pow`) call any; loading libm for those cost 0.5 MiB of resident pages in
//! every edge, idle or not (the loader touches its symbol tables and relocations, and
//! the kernel maps 64 KiB around every touched page), against a few KiB of code here
//! (`benches/RESULTS.md`, issue 14, session 32).
//!
//! The `libm` crate is the Rust project's port of musl's, whose `exp`, `log`, `log2`
//! and `pow` are the same Arm optimized-routines code glibc ships. Defined here, the
//! linker resolves the calls to these and, with `--as-needed` (rustc's default on
//! Linux), leaves libm out of the executable's needed libraries.

// SAFETY (for each): plain functions of their argument, with the C signatures and
// semantics their names promise; nothing else in the process defines them.

#[unsafe(no_mangle)]
#[expect(unsafe_code, reason = "defines libm's C symbol")]
extern "C" fn exp(x: f64) -> f64 {
    libm::exp(x)
}

#[unsafe(no_mangle)]
#[expect(unsafe_code, reason = "defines libm's C symbol")]
extern "C" fn log(x: f64) -> f64 {
    libm::log(x)
}

#[unsafe(no_mangle)]
#[expect(unsafe_code, reason = "defines libm's C symbol")]
extern "C" fn log1p(x: f64) -> f64 {
    libm::log1p(x)
}

#[unsafe(no_mangle)]
#[expect(unsafe_code, reason = "defines libm's C symbol")]
extern "C" fn log2(x: f64) -> f64 {
    libm::log2(x)
}

#[unsafe(no_mangle)]
#[expect(unsafe_code, reason = "defines libm's C symbol")]
extern "C" fn pow(x: f64, y: f64) -> f64 {
    libm::pow(x, y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_functions_answer_as_libm_does() {
        let close = |a: f64, b: f64| (a - b).abs() <= f64::EPSILON * b.abs().max(1.0);
        assert!(close(exp(1.0), std::f64::consts::E));
        assert!(close(log(std::f64::consts::E), 1.0));
        assert!(
            close(log1p(1e-20), 1e-20),
            "log1p keeps tiny arguments exact"
        );
        assert_eq!(log2(1024.0), 10.0);
        assert_eq!(pow(2.0, 10.0), 1024.0);
        assert!(close(pow(0.9, 0.5), 0.9_f64.sqrt()));
        assert!(log(-1.0).is_nan() && exp(f64::INFINITY).is_infinite());
    }
}
