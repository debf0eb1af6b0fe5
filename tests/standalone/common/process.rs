//! Child processes that die with the test.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::*;

/// A child process that is killed when dropped. Its output goes to a log file that is
/// printed on drop unless the test passed.
pub struct Proc {
    pub(super) child: Child,
    pub(super) label: String,
    pub(super) args: Vec<String>,
    pub(super) log_path: PathBuf,
    pub(super) stdout_path: PathBuf,
    pub(super) passed: Arc<AtomicBool>,
    pub(super) reaped: Option<ExitStatus>,
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the process wrote to stderr: its logs.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// What the process wrote to stdout: the edge's access log.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout_path).unwrap_or_default()
    }

    /// Errors if the process has already exited (with its log, to explain why).
    pub fn check_alive(&mut self) -> TestResult {
        if let Some(status) = self.try_exit()? {
            return Err(err(format!(
                "{} exited early with {status}; args {:?}; log:\n{}",
                self.label,
                self.args,
                self.log()
            )));
        }
        Ok(())
    }

    pub fn try_exit(&mut self) -> Result<Option<ExitStatus>, BoxError> {
        if self.reaped.is_none() {
            self.reaped = self.child.try_wait()?;
        }
        Ok(self.reaped)
    }

    /// Sends a signal with the `kill` utility (unsafe code is forbidden here).
    pub fn signal(&self, sig: &str) -> TestResult {
        let st = Command::new("kill")
            .args([format!("-{sig}"), self.pid().to_string()])
            .status()?;
        ensure!(st.success(), "kill -{sig} {} failed: {st}", self.pid());
        Ok(())
    }

    /// Polls until the process exits, up to `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus, BoxError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.try_exit()? {
                return Ok(st);
            }
            if Instant::now() >= deadline {
                return Err(err(format!(
                    "{} did not exit within {timeout:?}",
                    self.label
                )));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.reaped.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if !self.passed.load(Ordering::SeqCst) || std::thread::panicking() {
            eprintln!(
                "===== {} (pid {}, args {:?}) log =====\n{}\n===== stdout =====\n{}\n===== end {} =====",
                self.label,
                self.child.id(),
                self.args,
                self.log(),
                self.stdout(),
                self.label
            );
        }
    }
}
