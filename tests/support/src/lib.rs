//! What aether-edge's test suites share (`tests/standalone`, `tests/kubernetes`): one
//! error type, processes that die with the test and show their logs when it fails, one
//! `eventually`, loopback networks and ports handed out once per test binary, HTTP/1.1
//! and h2c clients, test certificates and TLS clients, the admin server's answers, install scripts of test tools, and
//! builders for the manifests tests write most.
//!
//! Everything here runs real processes and real sockets on 127.0.0.0/8; nothing is
//! mocked. Waits are bounded: every loop has a deadline.

use std::error::Error;

pub mod admin;
pub mod client;
pub mod manifest;
pub mod net;
pub mod process;
pub mod tls;
pub mod tools;
pub mod wait;

pub use admin::*;
pub use client::*;
pub use net::*;
pub use process::*;
pub use tools::*;
pub use wait::*;

/// The error of every test helper: anything, with its message.
pub type BoxError = Box<dyn Error + Send + Sync>;
/// What a test returns.
pub type TestResult = Result<(), BoxError>;

/// Builds a `BoxError` from a message.
pub fn err(msg: impl Into<String>) -> BoxError {
    msg.into().into()
}

/// Fails the enclosing function (which returns `Result<_, BoxError>`) with a message
/// unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($arg:tt)+) => {
        if !($cond as bool) {
            return Err($crate::err(format!($($arg)+)));
        }
    };
}

#[cfg(test)]
mod tests;
