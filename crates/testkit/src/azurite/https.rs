//! The production-style mode of the harness ([`Azurite::start_https`]):
//! HTTPS with the caller's certificate, OAuth (`--oauth basic`), one named
//! account, and blob and queue on addresses of the caller's choosing.

use std::fs::File;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use super::topology::Program;
use super::{
    Azurite, HarnessError, POLL_INTERVAL, PROBE_TIMEOUT, START_TIMEOUT, Topology, binary_path,
    reserve_ports, reserved_ports,
};

/// How [`Azurite::start_https`] serves: production-style, over HTTPS with
/// OAuth, for one named account.
#[derive(Debug, Clone)]
pub struct HttpsOptions {
    /// Where the blob service listens (e.g. `127.0.0.2:443`).
    pub blob: SocketAddr,
    /// Where the queue service listens (e.g. `127.0.0.3:443`).
    pub queue: SocketAddr,
    /// PEM certificate (chain) for the services' host names.
    pub cert: PathBuf,
    /// Its PEM private key.
    pub key: PathBuf,
    /// The account Azurite serves (taken from the request's host name).
    pub account_name: String,
    /// Its key (`AZURITE_ACCOUNTS` needs one; OAuth clients never use it).
    pub account_key: String,
}

impl Azurite {
    /// Starts Azurite production-style (see [`HttpsOptions`]): HTTPS,
    /// `--oauth basic`, the one account, blob and queue where asked (the
    /// table service on a free loopback port). Ready once both addresses
    /// accept connections while Azurite runs: the addresses are the
    /// caller's (a namespace's), and Azurite exits if it cannot bind them
    /// ([`HarnessError::PortInUse`]). Azurite's debug log (which records
    /// every bearer-token validation) is [`Azurite::debug_log`].
    pub fn start_https(options: HttpsOptions) -> Result<Self, HarnessError> {
        let binary = binary_path();
        if !binary.exists() {
            return Err(HarnessError::NotInstalled(binary));
        }
        let ports = reserve_ports()?;
        // Only the table service takes a free loopback port.
        if let Some(reserved) = reserved_ports().as_mut() {
            reserved.remove(&ports[0]);
            reserved.remove(&ports[1]);
        }
        let mut azurite = Azurite {
            binary,
            workspace: tempfile::Builder::new().prefix("azurite-").tempdir()?,
            blob_port: options.blob.port(),
            queue_port: options.queue.port(),
            table_port: ports[2],
            probe_account: String::new(),
            https: Some(Box::new(options)),
            debug: true,
            topology: Topology::Shared,
            children: Vec::new(),
            starts: 0,
        };
        azurite.start_again()?;
        Ok(azurite)
    }

    /// The debug log of an Azurite started with [`Azurite::start_https`]
    /// or [`Azurite::start_recording`] (empty for the others).
    pub fn debug_log(&self) -> String {
        std::fs::read_to_string(self.debug_log_path()).unwrap_or_default()
    }

    pub(crate) fn debug_log_path(&self) -> std::path::PathBuf {
        self.workspace.path().join("debug.log")
    }

    pub(crate) fn start_https_process(
        &mut self,
        https: &HttpsOptions,
        log: File,
    ) -> Result<(), HarnessError> {
        let child = Command::new(&self.binary)
            .args([
                "--disableTelemetry",
                "--skipApiVersionCheck",
                "--oauth",
                "basic",
            ])
            .arg("--cert")
            .arg(&https.cert)
            .arg("--key")
            .arg(&https.key)
            .arg("--debug")
            .arg(self.debug_log_path())
            .arg("--location")
            .arg(self.workspace.path())
            .args(["--blobHost", &https.blob.ip().to_string()])
            .args(["--blobPort", &https.blob.port().to_string()])
            .args(["--queueHost", &https.queue.ip().to_string()])
            .args(["--queuePort", &https.queue.port().to_string()])
            .args(["--tableHost", "127.0.0.1"])
            .args(["--tablePort", &self.table_port.to_string()])
            .env(
                "AZURITE_ACCOUNTS",
                format!("{}:{}", https.account_name, https.account_key),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.children = vec![(Program::All, child)];
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            self.check_running()?;
            let listening = [https.blob, https.queue]
                .iter()
                .all(|addr| TcpStream::connect_timeout(addr, PROBE_TIMEOUT).is_ok());
            if listening {
                return self.check_running();
            }
            if Instant::now() >= deadline {
                let _ = self.stop();
                return Err(HarnessError::NotReady {
                    reason: format!(
                        "{} and {} did not accept connections within {START_TIMEOUT:?}",
                        https.blob, https.queue
                    ),
                    log: self.log_tail(),
                });
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }
}
