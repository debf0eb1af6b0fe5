//! The aether-edge binary's pieces: the CLI, the wiring of sources, controller and
//! proxy (`app`), the admin server, the manifest file source and the echo backend.

pub mod admin;
pub mod app;
pub mod cli;
pub mod config;
pub mod echo;
pub mod echo_retry;
pub mod files;
pub mod kubernetes;
pub mod mesh;
pub mod metrics;
pub mod portstate;
pub mod publish;

#[cfg(test)]
mod cli_reference_tests;
