//! The environment a worker needs to use `spot-worker dev`'s stand-ins, as
//! `export` lines; and `dev env`, which prints them once they answer.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::Args;
use spot_worker_local::{ACCOUNT_KEY, ACCOUNT_NAME, DEV_PORTS, azurite_answers};
use spot_worker_runtime::settings::table;

/// The lane settings `dev` uses unless its environment sets them: the
/// regular lane's queue, and the lanes' timing at a laptop's scale
/// (seconds where a fleet has minutes), so a job with a deadline of a
/// minute or two shows the lanes at work.
const LAPTOP_LANES: [(&str, &str); 3] = [
    (table::REGULAR_QUEUE.key, "jobs-regular"),
    (table::SWITCH_COST.key, "4s"),
    (table::LANE_KEEPER_EVERY.key, "1s"),
];

/// Where a worker finds the local stand-ins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevEnvironment {
    blob_port: u16,
    queue_port: u16,
    imds: SocketAddr,
    regular_imds: SocketAddr,
    lanes: Vec<(&'static str, String)>,
}

impl DevEnvironment {
    /// Azurite's blob and queue on these loopback ports, the IMDS emulator
    /// of the Spot VM at `imds` and of the regular VM at `regular_imds`;
    /// the lane settings from `lookup` (the environment), else
    /// [`LAPTOP_LANES`].
    pub fn new(
        blob_port: u16,
        queue_port: u16,
        imds: SocketAddr,
        regular_imds: SocketAddr,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Self {
        let lanes = LAPTOP_LANES
            .iter()
            .map(|&(key, laptop)| {
                let value = lookup(key).filter(|v| !v.trim().is_empty());
                (key, value.unwrap_or_else(|| laptop.to_owned()))
            })
            .collect();
        DevEnvironment {
            blob_port,
            queue_port,
            imds,
            regular_imds,
            lanes,
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

    /// The Spot VM's IMDS emulator's URL.
    pub fn imds_endpoint(&self) -> String {
        format!("http://{}", self.imds)
    }

    /// The regular VM's IMDS emulator's URL.
    pub fn regular_imds_endpoint(&self) -> String {
        format!("http://{}", self.regular_imds)
    }

    /// The regular lane's queue.
    pub fn regular_queue(&self) -> &str {
        self.lane_setting(table::REGULAR_QUEUE.key)
    }

    fn lane_setting(&self, key: &str) -> &str {
        self.lanes
            .iter()
            .find(|(k, _)| *k == key)
            .map_or("", |(_, value)| value)
    }

    /// The settings of the Spot VM's worker and of a shell, as (variable,
    /// value).
    pub fn variables(&self) -> Vec<(&'static str, String)> {
        let mut variables = vec![
            (table::CONNECTION_STRING.key, self.connection_string()),
            (table::IMDS_ENDPOINT.key, self.imds_endpoint()),
        ];
        variables.extend(self.lanes.iter().cloned());
        variables
    }

    /// The settings of the regular VM's worker: the same, on the regular
    /// lane, with its own IMDS emulator, and its health checks on a free
    /// port (the Spot VM's worker may hold the default one).
    pub fn regular_variables(&self) -> Vec<(&'static str, String)> {
        let mut variables = self.variables();
        variables.retain(|(key, _)| *key != table::IMDS_ENDPOINT.key);
        variables.extend([
            (table::IMDS_ENDPOINT.key, self.regular_imds_endpoint()),
            (table::LANE.key, "regular".to_owned()),
            (table::HEALTH_ADDR.key, "127.0.0.1:0".to_owned()),
        ]);
        variables
    }

    /// `export NAME='value'` lines for a POSIX shell.
    pub fn exports(&self) -> String {
        let mut text = String::new();
        for (name, value) in self.variables() {
            // A value with a single quote in it is quoted as '\''.
            let _ = writeln!(text, "export {name}='{}'", value.replace('\'', r"'\''"));
        }
        text
    }

    /// True once Azurite and both IMDS emulators answer.
    fn answers(&self) -> bool {
        let listens =
            |address| std::net::TcpStream::connect_timeout(address, Duration::from_secs(1)).is_ok();
        azurite_answers(self.blob_port, self.queue_port)
            && listens(&self.imds)
            && listens(&self.regular_imds)
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
                "no local environment answers (Azurite at 127.0.0.1:{}, the IMDS emulators at {} \
                 and {}) after {:?}: start it with `spot-worker dev`",
                environment.blob_port,
                environment.imds_endpoint(),
                environment.regular_imds_endpoint(),
                args.wait
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(address: &str) -> SocketAddr {
        address.parse().unwrap()
    }

    #[test]
    fn the_default_ports_are_the_development_storage_shortcut() {
        let default = DevEnvironment::new(
            10000,
            10001,
            at("127.0.0.1:8089"),
            at("127.0.0.1:8090"),
            |_| None,
        );
        assert_eq!(
            default.exports(),
            "export AZURE_STORAGE_CONNECTION_STRING='UseDevelopmentStorage=true'\n\
             export SPOT_WORKER_IMDS_ENDPOINT='http://127.0.0.1:8089'\n\
             export SPOT_WORKER_REGULAR_QUEUE='jobs-regular'\n\
             export SPOT_WORKER_SWITCH_COST='4s'\n\
             export SPOT_WORKER_LANE_KEEPER_EVERY='1s'\n"
        );
        let other = DevEnvironment::new(
            20000,
            20001,
            at("127.0.0.1:9000"),
            at("127.0.0.1:9001"),
            |_| None,
        );
        let text = other.connection_string();
        assert!(text.contains("BlobEndpoint=http://127.0.0.1:20000/devstoreaccount1;"));
        assert!(text.contains("QueueEndpoint=http://127.0.0.1:20001/devstoreaccount1;"));
        assert!(!other.exports().contains("''"));
    }

    #[test]
    fn the_environment_s_lane_settings_win_over_the_laptop_ones() {
        let environment = DevEnvironment::new(
            10000,
            10001,
            at("127.0.0.1:8089"),
            at("127.0.0.1:8090"),
            |key| match key {
                "SPOT_WORKER_REGULAR_QUEUE" => Some("mine-regular".to_owned()),
                "SPOT_WORKER_SWITCH_COST" => Some(" ".to_owned()),
                _ => None,
            },
        );
        assert_eq!(environment.regular_queue(), "mine-regular");
        let exports = environment.exports();
        assert!(exports.contains("export SPOT_WORKER_REGULAR_QUEUE='mine-regular'\n"));
        assert!(
            exports.contains("export SPOT_WORKER_SWITCH_COST='4s'\n"),
            "blank is unset"
        );
    }

    #[test]
    fn the_regular_worker_serves_the_regular_lane_on_its_own_vm() {
        let environment = DevEnvironment::new(
            10000,
            10001,
            at("127.0.0.1:8089"),
            at("127.0.0.1:8090"),
            |_| None,
        );
        let regular = environment.regular_variables();
        let value = |key: &str| {
            let all: Vec<&String> = regular
                .iter()
                .filter(|(k, _)| *k == key)
                .map(|(_, v)| v)
                .collect();
            assert_eq!(all.len(), 1, "{key} once: {regular:?}");
            all[0].clone()
        };
        assert_eq!(value("SPOT_WORKER_LANE"), "regular");
        assert_eq!(value("SPOT_WORKER_IMDS_ENDPOINT"), "http://127.0.0.1:8090");
        assert_eq!(value("SPOT_WORKER_REGULAR_QUEUE"), "jobs-regular");
        assert_eq!(value("SPOT_WORKER_HEALTH_ADDR"), "127.0.0.1:0");
    }

    #[test]
    fn a_single_quote_stays_inside_its_value() {
        let environment = DevEnvironment::new(
            10000,
            10001,
            at("127.0.0.1:8089"),
            at("127.0.0.1:8090"),
            |key| (key == "SPOT_WORKER_REGULAR_QUEUE").then(|| "it's".to_owned()),
        );
        let exports = environment.exports();
        assert!(
            exports.contains(r"export SPOT_WORKER_REGULAR_QUEUE='it'\''s'"),
            "{exports}"
        );
    }
}
