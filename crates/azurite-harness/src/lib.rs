//! Starts a real [Azurite](https://github.com/Azure/Azurite) storage emulator
//! for integration tests: free loopback ports, a temporary workspace, a
//! bounded wait until it answers, and a stop (SIGTERM, so it flushes its data)
//! on drop. It can be stopped and started again on the same ports and data,
//! to test recovery from a storage outage.
//!
//! The binary is `tools/azurite/node_modules/.bin/azurite` in the workspace
//! (installed by `npm ci --prefix tools/azurite`, which `scripts/test.sh`
//! runs), or whatever `AZURITE_BIN` names.

use std::fs::File;
use std::io::Read as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The emulator's well-known account name.
pub const ACCOUNT_NAME: &str = "devstoreaccount1";
/// The emulator's well-known account key (public, documented by Microsoft).
pub const ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// Generous, because CI machines can be slow to start node.
const START_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
const POLL_INTERVAL: Duration = Duration::from_millis(50);
const START_ATTEMPTS: usize = 3;

/// Why Azurite could not be started or stopped.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The binary is missing.
    #[error("azurite not found at {0} (run `npm ci --prefix tools/azurite`, or set AZURITE_BIN)")]
    NotInstalled(PathBuf),
    /// Spawning, port allocation or the workspace failed.
    #[error("azurite harness I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// Azurite exited or did not answer in time.
    #[error("azurite did not start: {reason}; its log:\n{log}")]
    NotReady {
        /// What went wrong.
        reason: String,
        /// The end of Azurite's output.
        log: String,
    },
}

/// A running (or stopped, between [`Azurite::stop`] and [`Azurite::start_again`])
/// Azurite process.
#[derive(Debug)]
pub struct Azurite {
    binary: PathBuf,
    workspace: tempfile::TempDir,
    blob_port: u16,
    queue_port: u16,
    table_port: u16,
    child: Option<Child>,
    starts: u32,
}

impl Azurite {
    /// Starts Azurite on free loopback ports with a fresh workspace and waits
    /// until its blob and queue services accept connections.
    pub fn start() -> Result<Self, HarnessError> {
        let binary = binary_path();
        if !binary.exists() {
            return Err(HarnessError::NotInstalled(binary));
        }
        // A port found free may be taken by someone else before Azurite binds
        // it; then Azurite exits and a fresh set of ports is tried.
        let mut last_error = None;
        for _ in 0..START_ATTEMPTS {
            let mut azurite = Azurite {
                binary: binary.clone(),
                workspace: tempfile::Builder::new().prefix("azurite-").tempdir()?,
                blob_port: free_port()?,
                queue_port: free_port()?,
                table_port: free_port()?,
                child: None,
                starts: 0,
            };
            match azurite.start_again() {
                Ok(()) => return Ok(azurite),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| HarnessError::NotReady {
            reason: "no start attempted".to_owned(),
            log: String::new(),
        }))
    }

    /// Starts a stopped Azurite again on the same ports and workspace (so
    /// its data survives), and waits until it answers.
    pub fn start_again(&mut self) -> Result<(), HarnessError> {
        if self.child.is_some() {
            return Ok(());
        }
        self.starts += 1;
        let log_path = self.log_path();
        let log = File::create(&log_path)?;
        let child = Command::new(&self.binary)
            .args([
                "--silent",
                "--disableTelemetry",
                // The 1.x SDK may send an x-ms-version newer than this
                // Azurite knows; the operations we use are unchanged.
                "--skipApiVersionCheck",
            ])
            .arg("--location")
            .arg(self.workspace.path())
            .args([
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                &self.blob_port.to_string(),
            ])
            .args([
                "--queueHost",
                "127.0.0.1",
                "--queuePort",
                &self.queue_port.to_string(),
            ])
            .args([
                "--tableHost",
                "127.0.0.1",
                "--tablePort",
                &self.table_port.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.child = Some(child);
        self.wait_until_ready()
    }

    /// Stops Azurite gracefully (SIGTERM, so it saves its data), killing it
    /// if it does not exit in time.
    pub fn stop(&mut self) -> Result<(), HarnessError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if let Ok(pid) = libc::pid_t::try_from(child.id()) {
            // SAFETY: kill(2) has no memory-safety preconditions; the pid is our child's.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(POLL_INTERVAL);
        }
        child.kill()?;
        child.wait()?;
        Ok(())
    }

    /// `http://127.0.0.1:<port>/devstoreaccount1`, the blob service URL.
    pub fn blob_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/{ACCOUNT_NAME}", self.blob_port)
    }

    /// `http://127.0.0.1:<port>/devstoreaccount1`, the queue service URL.
    pub fn queue_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/{ACCOUNT_NAME}", self.queue_port)
    }

    /// A full connection string with the well-known account key and this
    /// instance's endpoints.
    pub fn connection_string(&self) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName={ACCOUNT_NAME};AccountKey={ACCOUNT_KEY};BlobEndpoint={};QueueEndpoint={};",
            self.blob_endpoint(),
            self.queue_endpoint()
        )
    }

    fn log_path(&self) -> PathBuf {
        self.workspace
            .path()
            .join(format!("azurite-{}.log", self.starts))
    }

    fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = File::open(self.log_path()) {
            let _ = file.read_to_string(&mut text);
        }
        let start = text.len().saturating_sub(4000);
        text.get(start..).unwrap_or_default().to_owned()
    }

    fn wait_until_ready(&mut self) -> Result<(), HarnessError> {
        let deadline = Instant::now() + START_TIMEOUT;
        let ports = [self.blob_port, self.queue_port];
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.child = None;
                return Err(HarnessError::NotReady {
                    reason: format!("it exited with {status}"),
                    log: self.log_tail(),
                });
            }
            if ports.iter().all(|port| accepts_connections(*port)) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let _ = self.stop();
                return Err(HarnessError::NotReady {
                    reason: format!("no answer within {START_TIMEOUT:?}"),
                    log: self.log_tail(),
                });
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        if let Err(error) = self.stop() {
            eprintln!("failed to stop azurite: {error}");
        }
    }
}

fn binary_path() -> PathBuf {
    if let Some(path) = std::env::var_os("AZURITE_BIN") {
        return PathBuf::from(path);
    }
    // crates/azurite-harness -> workspace root.
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/azurite/node_modules/.bin/azurite")
}

fn free_port() -> std::io::Result<u16> {
    // The OS picks a free port; there is a small window before Azurite binds
    // it, which is acceptable for tests.
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

fn accepts_connections(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_stops_and_restarts_on_the_same_ports() {
        let mut azurite = Azurite::start().expect("azurite starts");
        assert!(accepts_connections(azurite.queue_port));
        azurite.stop().unwrap();
        assert!(!accepts_connections(azurite.queue_port));
        azurite.start_again().unwrap();
        assert!(accepts_connections(azurite.blob_port));
    }
}
