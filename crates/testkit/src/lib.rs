//! The test kit (dev only): what the project's tests and benchmarks share.
//!
//! - [`Azurite`]: a real storage emulator per test (below);
//! - [`contract`]: what every checkpoint and result store must do, run
//!   against each backend;
//! - [`faulty`]: any queue with switchable faults and a record of calls;
//! - [`counting`]: any checkpoint store with a count of requests by kind;
//! - [`otlp`]: a telemetry collector that decodes what the exporters send;
//! - [`bench`]: what every benchmark binary does before it measures;
//! - [`procfs`]: CPU time and memory of processes, from `/proc`;
//! - [`chaos`]: the chaos run (real worker processes, emulated Spot VMs,
//!   a seeded fault schedule, and the checks).
//!
//! [`Azurite`] starts a real [Azurite](https://github.com/Azure/Azurite)
//! storage emulator for integration tests: free loopback ports, a temporary workspace, a
//! bounded wait until it answers, and a stop (SIGTERM, so it flushes its data)
//! on drop. It can be stopped and started again on the same ports and data,
//! to test recovery from a storage outage.
//!
//! Readiness is proven over HTTP, not just by a TCP accept: each instance
//! gets an extra storage account with a random name (`AZURITE_ACCOUNTS`),
//! and only an Azurite that knows that account answers a request for it
//! with 403 (any other answers 404). So another test's Azurite, or any other
//! server that took one of our ports while we were stopped, is never
//! mistaken for ours. A port taken by someone else makes Azurite exit with
//! `EADDRINUSE`, reported as [`HarnessError::PortInUse`].
//!
//! [`Azurite::start_separate`] serves blob and queue from two processes
//! (`azurite-blob`, `azurite-queue`) instead of one; see [`topology`].
//!
//! [`Azurite::start_https`] starts it as production looks instead: HTTPS
//! with a given certificate, OAuth (`--oauth basic`: bearer tokens are
//! checked for issuer, audience and lifetime), a named account, and blob and
//! queue on port 443 of addresses of the caller's choosing (inside a network
//! namespace, where `https://<account>.blob.core.windows.net` resolves to
//! them).
//!
//! The binary is `tools/azurite/node_modules/.bin/azurite` in the workspace
//! (installed by `npm ci --prefix tools/azurite`, which `scripts/test.sh`
//! runs), or whatever `AZURITE_BIN` names.

use std::collections::HashSet;
use std::collections::hash_map::RandomState;
use std::fs::File;
use std::hash::{BuildHasher as _, Hasher as _};
use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub mod bench;
pub mod chaos;
pub mod contract;
pub mod counting;
pub mod faulty;
mod https;
pub mod otlp;
pub mod procfs;
pub mod topology;

pub use https::HttpsOptions;
use topology::Program;
pub use topology::{AzuriteProcess, Topology};

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

/// Ports handed to an Azurite of this process and not yet released (on
/// drop). Parallel tests run in one process; without this, a test's
/// [`free_port`] could pick a port of another test's Azurite while that one
/// is stopped for an outage, and its restart would fail.
static RESERVED_PORTS: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

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
    topology: Topology,
    /// The running processes; empty while stopped.
    children: Vec<(Program, Child)>,
    starts: u32,
}

impl Azurite {
    /// Starts Azurite on free loopback ports with a fresh workspace and waits
    /// until its blob and queue services accept connections.
    pub fn start() -> Result<Self, HarnessError> {
        Self::start_with(Topology::Shared)
    }

    fn start_with(topology: Topology) -> Result<Self, HarnessError> {
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

/// What answered on a port.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Probe {
    /// Nothing listens (yet).
    Refused,
    /// This instance: it knows the probe account.
    ThisAzurite,
    /// Some Azurite that does not know the probe account: another test's.
    OtherAzurite,
    /// Something else, or no complete answer in time.
    Other(String),
}

impl std::fmt::Display for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Probe::Refused => f.write_str("connection refused"),
            Probe::ThisAzurite => f.write_str("this azurite"),
            Probe::OtherAzurite => f.write_str("another azurite instance holds the port"),
            Probe::Other(what) => write!(f, "not this azurite: {what}"),
        }
    }
}

/// Asks the server on `port` to list the containers/queues of `account`,
/// without credentials. An Azurite that knows the account refuses with 403
/// (the account exists, the request is not signed); one that does not
/// answers 404. Both say `Server: Azurite-…`.
fn probe(port: u16, account: &str) -> Probe {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT) else {
        return Probe::Refused;
    };
    let _ = stream.set_read_timeout(Some(PROBE_TIMEOUT));
    let _ = stream.set_write_timeout(Some(PROBE_TIMEOUT));
    let request = format!(
        "GET /{account}?comp=list HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    );
    if let Err(e) = stream.write_all(request.as_bytes()) {
        return Probe::Other(format!("request not sent: {e}"));
    }
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    // The head is all we need; it is small, so cap what is read.
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e) => return Probe::Other(format!("no HTTP answer: {e}")),
        }
    }
    let head = String::from_utf8_lossy(&head);
    let status = head
        .lines()
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse::<u16>().ok());
    let azurite = head.lines().any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("server") && value.trim().starts_with("Azurite-")
        })
    });
    match (status, azurite) {
        (Some(403), true) => Probe::ThisAzurite,
        (Some(_), true) => Probe::OtherAzurite,
        (Some(status), false) => Probe::Other(format!("HTTP {status} from a non-Azurite server")),
        (None, _) => Probe::Other("no HTTP status line".to_owned()),
    }
}

/// The address of an `EADDRINUSE` in Azurite's log
/// (`listen EADDRINUSE: address already in use 127.0.0.1:41001`).
fn address_in_use(log: &str) -> Option<String> {
    let line = log.lines().find(|line| line.contains("EADDRINUSE"))?;
    let address = line
        .rsplit(' ')
        .next()
        .filter(|word| word.contains(':'))
        .unwrap_or("one of its ports");
    Some(address.to_owned())
}

fn reserved_ports() -> MutexGuard<'static, Option<HashSet<u16>>> {
    RESERVED_PORTS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Three distinct free ports, none of them reserved by another Azurite of
/// this process; they stay reserved until that Azurite is dropped.
fn reserve_ports() -> std::io::Result<[u16; 3]> {
    let mut reserved = reserved_ports();
    let set = reserved.get_or_insert_with(HashSet::new);
    let mut ports = [0; 3];
    for slot in &mut ports {
        // Bounded: the OS hands out ports from a large range, and only a
        // handful are reserved at any time.
        let mut found = None;
        for _ in 0..100 {
            let port = free_port()?;
            if set.insert(port) {
                found = Some(port);
                break;
            }
        }
        *slot = found.ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "no free loopback port that is not already reserved",
            )
        })?;
    }
    Ok(ports)
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

/// The workspace's root directory (this crate is `crates/testkit`).
pub fn workspace_root() -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    crate_dir
        .ancestors()
        .nth(2)
        .map_or_else(|| crate_dir.to_owned(), Path::to_owned)
}

fn binary_path() -> PathBuf {
    if let Some(path) = std::env::var_os("AZURITE_BIN") {
        return PathBuf::from(path);
    }
    workspace_root().join("tools/azurite/node_modules/.bin/azurite")
}

fn free_port() -> std::io::Result<u16> {
    // The OS picks a free port. Another process may take it before Azurite
    // binds it (then `start` retries on fresh ports), or while Azurite is
    // stopped (then `start_again` reports `PortInUse`); other Azurites of this
    // process avoid it through `RESERVED_PORTS`.
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

#[cfg(test)]
mod tests {
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
