//! [`Azurite`]: a real storage emulator per test: free loopback ports, a
//! temporary workspace, a bounded wait until it answers, and a stop
//! (SIGTERM, so it flushes its data) on drop; see the crate docs.

use std::collections::hash_map::RandomState;
use std::fs::File;
use std::hash::{BuildHasher as _, Hasher as _};
use std::io::Read as _;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

mod https;
mod ports;
mod probe;
pub mod topology;

pub use https::HttpsOptions;
use ports::{reserve_ports, reserved_ports};
use probe::{Probe, address_in_use, probe};
use topology::Program;
pub use topology::{AzuriteProcess, Topology};

use crate::workspace_root;

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
/// Bound of one readiness probe (connect, request, response head).
const PROBE_TIMEOUT: Duration = Duration::from_millis(1000);

/// Why Azurite could not be started or stopped.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The binary is missing.
    #[error("azurite not found at {0} (run `npm ci --prefix tools/azurite`, or set AZURITE_BIN)")]
    NotInstalled(PathBuf),
    /// Spawning, port allocation or the workspace failed.
    #[error("Azurite harness I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// Another process holds one of the ports (Azurite exited with
    /// `EADDRINUSE`). [`Azurite::start`] retries on fresh ports;
    /// [`Azurite::start_again`] must reuse its ports and cannot.
    #[error(
        "azurite could not listen on {address}: the address is in use by another process \
         (EADDRINUSE; a port found free was taken before azurite bound it); its log:\n{log}"
    )]
    PortInUse {
        /// The address Azurite could not bind, as it reported it.
        address: String,
        /// The end of Azurite's output.
        log: String,
    },
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
    /// An extra account only this instance knows; see the crate docs.
    probe_account: String,
    /// Production-style HTTPS and OAuth instead of plain local HTTP (boxed:
    /// most instances are local, and users keep `Azurite` in enums).
    https: Option<Box<HttpsOptions>>,
    /// Whether a local Azurite writes its debug log ([`Azurite::debug_log`]).
    debug: bool,
    topology: Topology,
    /// The running processes; empty while stopped.
    children: Vec<(Program, Child)>,
    starts: u32,
}

impl Azurite {
    /// Starts Azurite on free loopback ports with a fresh workspace and waits
    /// until its blob and queue services accept connections.
    pub fn start() -> Result<Self, HarnessError> {
        Self::start_with(Topology::Shared, false)
    }

    /// Like [`Azurite::start`], with Azurite's debug log on: every request
    /// with the operation Azurite dispatched it to (`Operation=...`), its
    /// queue or container and its status, read with [`Azurite::debug_log`].
    /// For tests that need to know which storage operations a program
    /// really issues (the log is large: not for benchmarks).
    pub fn start_recording() -> Result<Self, HarnessError> {
        Self::start_with(Topology::Shared, true)
    }

    fn start_with(topology: Topology, debug: bool) -> Result<Self, HarnessError> {
        let binary = binary_path();
        if !binary.exists() {
            return Err(HarnessError::NotInstalled(binary));
        }
        // A port found free may be taken by someone else before Azurite binds
        // it; then Azurite exits and a fresh set of ports is tried.
        let mut last_error = None;
        for _ in 0..START_ATTEMPTS {
            let ports = reserve_ports()?;
            let mut azurite = Azurite {
                binary: binary.clone(),
                workspace: tempfile::Builder::new().prefix("azurite-").tempdir()?,
                blob_port: ports[0],
                queue_port: ports[1],
                table_port: ports[2],
                probe_account: format!("probe{:016x}", random_u64()),
                https: None,
                debug,
                topology,
                children: Vec::new(),
                starts: 0,
            };
            if let Some(missing) = topology
                .programs()
                .iter()
                .map(|program| azurite.program_path(*program))
                .find(|path| !path.exists())
            {
                return Err(HarnessError::NotInstalled(missing));
            }
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
    /// its data survives), and waits until it answers as this instance.
    /// Fails with [`HarnessError::PortInUse`] if another process took one of
    /// the ports meanwhile (other tests in this process never do: their
    /// ports are chosen to avoid this instance's).
    pub fn start_again(&mut self) -> Result<(), HarnessError> {
        if !self.children.is_empty() {
            return Ok(());
        }
        self.starts += 1;
        let log_path = self.log_path();
        let log = File::create(&log_path)?;
        if let Some(https) = self.https.clone() {
            return self.start_https_process(&https, log);
        }
        for &program in self.topology.programs() {
            let child = self
                .local_command(program)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log.try_clone()?)
                .spawn()?;
            self.children.push((program, child));
        }
        self.wait_until_ready()
    }

    /// Stops Azurite gracefully (SIGTERM, so it saves its data), killing it
    /// if it does not exit in time.
    pub fn stop(&mut self) -> Result<(), HarnessError> {
        let mut first_error = None;
        for (_, child) in std::mem::take(&mut self.children) {
            if let Err(error) = stop_process(child) {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
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
        let mut last = Probe::Refused;
        loop {
            // Checked first, and again after the probes: an Azurite that
            // could not bind exits, while whoever holds the port answers.
            self.check_running()?;
            let probes: Vec<Probe> = ports
                .iter()
                .map(|port| probe(*port, &self.probe_account))
                .collect();
            if probes.iter().all(|p| *p == Probe::ThisAzurite) {
                self.check_running()?;
                return Ok(());
            }
            if let Some(other) = probes.into_iter().find(|p| *p != Probe::ThisAzurite) {
                last = other;
            }
            if Instant::now() >= deadline {
                let _ = self.stop();
                return Err(HarnessError::NotReady {
                    reason: format!(
                        "no answer as this instance within {START_TIMEOUT:?} (last probe: {last})"
                    ),
                    log: self.log_tail(),
                });
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// An error if Azurite exited: [`HarnessError::PortInUse`] if its log
    /// says a port was taken.
    fn check_running(&mut self) -> Result<(), HarnessError> {
        if self.children.is_empty() {
            return Err(HarnessError::NotReady {
                reason: "it is not running".to_owned(),
                log: self.log_tail(),
            });
        }
        let mut exited = None;
        for (program, child) in &mut self.children {
            if let Some(status) = child.try_wait()? {
                exited = Some((program.name(), status));
                break;
            }
        }
        let Some((program, status)) = exited else {
            return Ok(());
        };
        // The others are of no use without it.
        let _ = self.stop();
        let log = self.log_tail();
        if let Some(address) = address_in_use(&log) {
            return Err(HarnessError::PortInUse { address, log });
        }
        Err(HarnessError::NotReady {
            reason: format!("{program} exited with {status}"),
            log,
        })
    }
}

/// Stops one Azurite process gracefully (SIGTERM, so it saves its data),
/// killing it if it does not exit in time.
fn stop_process(mut child: Child) -> Result<(), HarnessError> {
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

impl Drop for Azurite {
    fn drop(&mut self) {
        if let Err(error) = self.stop() {
            eprintln!("failed to stop azurite: {error}");
        }
        if let Some(reserved) = reserved_ports().as_mut() {
            for port in [self.blob_port, self.queue_port, self.table_port] {
                reserved.remove(&port);
            }
        }
    }
}

/// A random number from the standard library's per-process random hash
/// keys (no extra dependency for one name).
fn random_u64() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.finish()
}

fn binary_path() -> PathBuf {
    if let Some(path) = std::env::var_os("AZURITE_BIN") {
        return PathBuf::from(path);
    }
    workspace_root().join("tools/azurite/node_modules/.bin/azurite")
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};

    use super::*;

    fn accepts_connections(port: u16) -> bool {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
    }

    #[test]
    fn starts_stops_and_restarts_on_the_same_ports() {
        let mut azurite = Azurite::start().expect("azurite starts");
        assert!(accepts_connections(azurite.queue_port));
        azurite.stop().unwrap();
        assert!(!accepts_connections(azurite.queue_port));
        azurite.start_again().unwrap();
        assert!(accepts_connections(azurite.blob_port));
    }

    #[test]
    fn readiness_tells_this_instance_from_another_azurite_or_server() {
        let azurite = Azurite::start().expect("azurite starts");
        for port in [azurite.blob_port, azurite.queue_port] {
            assert_eq!(probe(port, &azurite.probe_account), Probe::ThisAzurite);
            // What another test's Azurite on this port would look like.
            assert_eq!(probe(port, "probe0000000000000000"), Probe::OtherAzurite);
        }
        // A server that accepts and never answers is not ready.
        let silent = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = silent.local_addr().unwrap().port();
        assert!(matches!(
            probe(port, &azurite.probe_account),
            Probe::Other(_)
        ));
        drop(silent);
        assert_eq!(probe(port, &azurite.probe_account), Probe::Refused);
    }

    #[test]
    fn a_port_taken_during_an_outage_is_reported_as_in_use() {
        let mut azurite = Azurite::start().expect("azurite starts");
        azurite.stop().unwrap();
        // Someone else binds the queue port while Azurite is down.
        let squatter = TcpListener::bind((Ipv4Addr::LOCALHOST, azurite.queue_port)).unwrap();
        let err = azurite.start_again().unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, HarnessError::PortInUse { ref address, .. } if address.ends_with(&format!(":{}", azurite.queue_port))),
            "{text}"
        );
        assert!(text.contains("EADDRINUSE"), "{text}");
        drop(squatter);
        azurite.start_again().expect("starts once the port is free");
    }

    #[test]
    fn ports_of_live_instances_are_never_handed_out_again() {
        let first = reserve_ports().unwrap();
        let second = reserve_ports().unwrap();
        let all: HashSet<u16> = first.iter().chain(&second).copied().collect();
        assert_eq!(all.len(), 6);
        if let Some(reserved) = reserved_ports().as_mut() {
            for port in all {
                reserved.remove(&port);
            }
        }
    }

    #[test]
    fn eaddrinuse_lines_name_the_address() {
        let log = "Azurite Blob service is starting at http://127.0.0.1:41001\n\
                   Exit due to unhandled error: listen EADDRINUSE: address already in use 127.0.0.1:41001\n";
        assert_eq!(address_in_use(log).as_deref(), Some("127.0.0.1:41001"));
        assert_eq!(address_in_use("all good"), None);
    }
}
