//! The environment a worker needs to use `spot-worker dev`'s stand-ins, as
//! `export` lines; and `dev env`, which prints them once they answer.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::Args;
use spot_worker_local::{ACCOUNT_KEY, ACCOUNT_NAME, DEV_PORTS, azurite_answers};
use spot_worker_runtime::settings::table;

/// Where a worker finds the local stand-ins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevEnvironment {
    blob_port: u16,
    queue_port: u16,
    imds: SocketAddr,
}

impl DevEnvironment {
    /// Azurite's blob and queue on these loopback ports, the IMDS emulator
    /// at `imds`.
    pub fn new(blob_port: u16, queue_port: u16, imds: SocketAddr) -> Self {
        DevEnvironment {
            blob_port,
            queue_port,
            imds,
        }
    }

    /// The storage connection string: `UseDevelopmentStorage=true` on
    /// Azurite's default ports, the full string otherwise.
    pub fn connection_string(&self) -> String {
        if [self.blob_port, self.queue_port] == [DEV_PORTS[0], DEV_PORTS[1]] {
            return "UseDevelopmentStorage=true".to_owned();
        }
        format!(
            "DefaultEndpointsProtocol=http;AccountName={ACCOUNT_NAME};AccountKey={ACCOUNT_KEY};\
             BlobEndpoint=http://127.0.0.1:{}/{ACCOUNT_NAME};\
             QueueEndpoint=http://127.0.0.1:{}/{ACCOUNT_NAME};",
            self.blob_port, self.queue_port
        )
    }

    /// The IMDS emulator's URL.
    pub fn imds_endpoint(&self) -> String {
        format!("http://{}", self.imds)
    }

    /// The settings, as (variable, value).
    pub fn variables(&self) -> Vec<(&'static str, String)> {
        vec![
            (table::CONNECTION_STRING.key, self.connection_string()),
            (table::IMDS_ENDPOINT.key, self.imds_endpoint()),
        ]
    }

    /// `export NAME='value'` lines for a POSIX shell.
    pub fn exports(&self) -> String {
        let mut text = String::new();
        for (name, value) in self.variables() {
            // Values hold no single quote (checked by a test).
            let _ = writeln!(text, "export {name}='{value}'");
        }
        text
    }

    /// True once Azurite and the IMDS emulator both answer.
    fn answers(&self) -> bool {
        azurite_answers(self.blob_port, self.queue_port)
            && std::net::TcpStream::connect_timeout(&self.imds, Duration::from_secs(1)).is_ok()
    }
}

#[derive(Debug, Args)]
pub struct EnvArgs {
    /// The longest to wait for the environment to answer.
    #[arg(long, default_value = "2m", value_parser = crate::parse_duration)]
    wait: Duration,
}

/// Prints the `export` lines once the environment answers.
pub async fn run(environment: DevEnvironment, args: EnvArgs) -> Result<()> {
    let deadline = Instant::now() + args.wait;
    loop {
        let probe = environment.clone();
        if tokio::task::spawn_blocking(move || probe.answers()).await? {
            print!("{}", environment.exports());
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "no local environment answers (Azurite at 127.0.0.1:{}, the IMDS emulator at {}) \
                 after {:?}: start it with `spot-worker dev`",
                environment.blob_port,
                environment.imds_endpoint(),
                args.wait
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_ports_are_the_development_storage_shortcut() {
        let default = DevEnvironment::new(10000, 10001, "127.0.0.1:8089".parse().unwrap());
        assert_eq!(
            default.exports(),
            "export AZURE_STORAGE_CONNECTION_STRING='UseDevelopmentStorage=true'\n\
             export SPOT_WORKER_IMDS_ENDPOINT='http://127.0.0.1:8089'\n"
        );
        let other = DevEnvironment::new(20000, 20001, "127.0.0.1:9000".parse().unwrap());
        let text = other.connection_string();
        assert!(text.contains("BlobEndpoint=http://127.0.0.1:20000/devstoreaccount1;"));
        assert!(text.contains("QueueEndpoint=http://127.0.0.1:20001/devstoreaccount1;"));
        assert!(!other.exports().contains("''"));
        for (_, value) in other.variables() {
            assert!(!value.contains('\''), "{value}");
        }
    }
}
