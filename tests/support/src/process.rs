//! Child processes that die with the test and show their logs when it fails.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::{BoxError, TestResult, ensure, err, wait::POLL_INTERVAL};

/// A child process that is killed when dropped. Its stderr goes to `<dir>/<label>.log`
/// and its stdout to `<dir>/<label>.stdout.log`; both are printed on drop when the test
/// panics, or, with [`Proc::until_passed`], unless the test said it passed.
pub struct Proc {
    child: Child,
    label: String,
    args: Vec<String>,
    log_path: PathBuf,
    stdout_path: PathBuf,
    passed: Option<Arc<AtomicBool>>,
    silent: bool,
    reaped: Option<ExitStatus>,
}

impl Proc {
    /// Starts `cmd` (stdin closed, output to log files in `dir`).
    pub fn spawn(mut cmd: Command, label: &str, dir: &Path) -> Result<Proc, BoxError> {
        let log_path = dir.join(format!("{label}.log"));
        let stdout_path = dir.join(format!("{label}.stdout.log"));
        let args = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(File::create(&stdout_path)?)
            .stderr(File::create(&log_path)?)
            .spawn()
            .map_err(|e| err(format!("starting {label} ({:?}): {e}", cmd.get_program())))?;
        Ok(Proc {
            child,
            label: label.to_owned(),
            args,
            log_path,
            stdout_path,
            passed: None,
            silent: false,
            reaped: None,
        })
    }

    /// Prints the logs on drop unless `passed` was set by then (a test that returns an
    /// error does not panic, and should still show them).
    pub fn until_passed(mut self, passed: &Arc<AtomicBool>) -> Proc {
        self.passed = Some(Arc::clone(passed));
        self
    }

    /// Never prints its logs (for servers whose logs are too long to read in a test's
    /// output, such as a kube-apiserver's: read them with [`Proc::log`]).
    pub fn silent(mut self) -> Proc {
        self.silent = true;
        self
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    /// What the process wrote to stderr: its logs.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// What the process wrote to stdout (the edge's access log).
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

    /// Kills the process now and waits for it (what dropping it does, keeping the
    /// handle for its logs).
    pub fn kill(&mut self) -> Result<ExitStatus, BoxError> {
        if let Some(st) = self.reaped {
            return Ok(st);
        }
        let _ = self.child.kill();
        let st = self.child.wait()?;
        self.reaped = Some(st);
        Ok(st)
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
        let failed = std::thread::panicking()
            || self
                .passed
                .as_ref()
                .is_some_and(|p| !p.load(Ordering::SeqCst));
        if failed && !self.silent {
            eprintln!(
                "===== {} (pid {}, args {:?}) log =====\n{}\n===== stdout =====\n{}\n===== end {} =====",
                self.label,
                self.child.id(),
                self.args,
                self.log().trim_end(),
                self.stdout().trim_end(),
                self.label
            );
        }
    }
}
