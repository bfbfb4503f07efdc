//! The documented settings, wired: logs, telemetry and Azure Storage. What
//! every worker built on spot-worker reads, so one deployment fits them all.
//!
//! [`Setup`] is the one call a worker makes; [`AzureSetup`] (storage and the
//! worker's configuration) and [`telemetry::init`] are the same pieces for
//! programs that want only some of them.
//!
//! Every setting is a row of [the settings table](crate::settings::table),
//! read from flags, the environment, the `SPOT_WORKER_CONFIG` file and the
//! defaults by one [`Source`]. Storage is chosen by
//! `AZURE_STORAGE_CONNECTION_STRING` (`UseDevelopmentStorage=true` for
//! Azurite), or else `SPOT_WORKER_STORAGE_ACCOUNT_URL` with the managed
//! identity `AZURE_CLIENT_ID` (or the Azure CLI's login).

use std::sync::Arc;
use std::time::Duration;

use spot_worker_azure::{
    AccountEndpoints, ArmScaleInProtection, AzureStorage, CredentialSettings, Credentials,
    StorageConfig, TokenCredential,
};
use spot_worker_imds::{ImdsClient, ImdsConfig};
use spot_worker_runtime::settings::{SettingError, Source, table};
use spot_worker_runtime::{ConfigError, Worker, WorkerConfig};
use spot_worker_telemetry::{self as telemetry, Telemetry, TelemetryConfig, TelemetryError};

/// Names the storage account when no connection string is given.
pub const STORAGE_ACCOUNT_URL_ENV: &str = table::STORAGE_ACCOUNT_URL.key;

/// Why the environment does not describe a usable worker.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A worker setting is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A setting could not be read.
    #[error(transparent)]
    Setting(#[from] SettingError),
    /// Logs or telemetry could not be installed (a bad `RUST_LOG`, an
    /// unusable exporter setting, or a global subscriber already set).
    /// Its message holds the cause's, which is therefore not also its
    /// `source()`: an error chain would say it twice.
    #[error("telemetry: {0}")]
    Telemetry(TelemetryError),
    /// The storage account or its credentials are unusable (the cause's
    /// message is part of this one, as for `Telemetry`).
    #[error("storage: {0}")]
    Storage(spot_worker_azure::StorageConfigError),
    /// `SPOT_WORKER_SCALE_IN_PROTECTION` is on but cannot be set up.
    #[error("scale-in protection: {0}")]
    ScaleInProtection(String),
    /// `SPOT_WORKER_STORAGE_ACCOUNT_URL` does not name a storage account.
    #[error("{STORAGE_ACCOUNT_URL_ENV}={value:?} is invalid: {reason}")]
    AccountUrl {
        /// The value as given.
        value: String,
        /// Why, and what is expected.
        reason: String,
    },
}

impl From<TelemetryError> for SetupError {
    fn from(error: TelemetryError) -> Self {
        SetupError::Telemetry(error)
    }
}

impl From<spot_worker_azure::StorageConfigError> for SetupError {
    fn from(error: spot_worker_azure::StorageConfigError) -> Self {
        SetupError::Storage(error)
    }
}

/// How long a [`Setup`] dropped with its telemetry (no worker was made from
/// it) waits for the last spans and metrics to be exported.
pub const FLUSH_ON_DROP: Duration = Duration::from_secs(5);

/// Everything a worker process sets up from its settings, in one call: logs
/// on stderr (always, whether or not telemetry is exported), telemetry
/// export (OTLP or Application Insights, when configured), the worker's
/// configuration and its storage account.
///
/// [`Setup::worker`] hands the telemetry to the worker, whose drain flushes
/// it within the eviction notice; a `Setup` dropped without making a worker
/// flushes it then (at most [`FLUSH_ON_DROP`]). The worker it makes owns the
/// process ([`Worker::owning_the_process`]): once `run` returns, the process
/// exits within a second however the `main` around it ends, even if a
/// handler's blocking code is still running (its message already released
/// and its writes fenced, see [`Job::results`](crate::Job::results)).
///
/// ```no_run
/// use spot_worker::{HandlerError, Job, Setup, handler_fn};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let setup = Setup::from_env()?; // logs from here on
/// let worker = setup.worker()?;
/// worker
///     .run(handler_fn(|job: Job| async move {
///         tracing::info!(body = job.text()?, "working");
///         Ok::<(), HandlerError>(())
///     }))
///     .await?;
/// # Ok(()) }
/// ```
pub struct Setup {
    /// The worker's settings.
    pub config: WorkerConfig,
    /// The storage account (queues, checkpoints, and any containers the
    /// application needs, e.g. for results).
    pub storage: AzureStorage,
    /// Until a worker takes it; then `None`, and dropping has nothing left
    /// to flush.
    telemetry: Option<Telemetry>,
    /// As [`AzureSetup`]'s.
    scale_in: ScaleIn,
}

impl Setup {
    /// Sets up from the environment and the `SPOT_WORKER_CONFIG` file.
    pub fn from_env() -> Result<Self, SetupError> {
        Self::from_source(&Source::from_env()?)
    }

    /// Sets up from `source` (e.g. the environment with the command line's
    /// flags on top: `Source::from_env()?.with_args(args)?`): installs the
    /// process's logging and telemetry ([`telemetry::init`]) first, so that
    /// reading the rest is logged, then reads the worker's configuration and
    /// storage ([`AzureSetup::from_source`]).
    pub fn from_source(source: &Source) -> Result<Self, SetupError> {
        let telemetry = telemetry::init(TelemetryConfig::from_source(source)?)?;
        let AzureSetup {
            config,
            storage,
            scale_in,
        } = AzureSetup::from_source(source)?;
        Ok(Setup {
            config,
            storage,
            telemetry: Some(telemetry),
            scale_in,
        })
    }

    /// The worker [`AzureSetup::worker`] makes, reporting to this setup's
    /// telemetry (which it flushes when it stops) and owning the process
    /// ([`Worker::owning_the_process`]): a `Setup` is made once per process.
    pub fn worker(mut self) -> Result<Worker, SetupError> {
        let worker = worker_on(&self.config, &self.storage, &self.scale_in)?.owning_the_process();
        Ok(match self.telemetry.take() {
            Some(telemetry) => worker.with_telemetry(telemetry),
            None => worker,
        })
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        if let Some(telemetry) = self.telemetry.take()
            && let Err(error) = telemetry.shutdown_blocking(FLUSH_ON_DROP)
        {
            tracing::warn!(%error, "telemetry not flushed");
        }
    }
}

/// A worker's configuration and its Azure Storage account, from the
/// environment; [`Setup`] is the same with logs and telemetry.
pub struct AzureSetup {
    /// The worker's settings.
    pub config: WorkerConfig,
    /// The storage account (queues, checkpoints, and any containers the
    /// application needs, e.g. for results).
    pub storage: AzureStorage,
    /// With `SPOT_WORKER_SCALE_IN_PROTECTION`: the identity that protects
    /// this VM from scale-in, and the idle grace.
    scale_in: ScaleIn,
}

/// With `SPOT_WORKER_SCALE_IN_PROTECTION`: the identity that protects this
/// VM from scale-in, and the idle grace.
type ScaleIn = Option<(Arc<dyn TokenCredential>, Duration)>;

impl AzureSetup {
    /// Reads the settings from the environment and the `SPOT_WORKER_CONFIG`
    /// file.
    pub fn from_env() -> Result<Self, SetupError> {
        Self::from_source(&Source::from_env()?)
    }

    /// Reads the settings from `source` (e.g. the environment with the
    /// command line's flags on top: `Source::from_env()?.with_args(args)?`).
    pub fn from_source(source: &Source) -> Result<Self, SetupError> {
        Self::build(source, |storage| storage)
    }

    /// The same settings for an operator's tools (`spot-worker enqueue`,
    /// `poison`, `checkpoints`, `status`): same account and credentials,
    /// with SAS tokens that may also list
    /// ([`StorageConfig::for_operator`]).
    pub fn operator_from_env() -> Result<Self, SetupError> {
        Self::build(&Source::from_env()?, StorageConfig::for_operator)
    }

    fn build(
        source: &Source,
        adjust: impl FnOnce(StorageConfig) -> StorageConfig,
    ) -> Result<Self, SetupError> {
        let config = WorkerConfig::from_source(source)?;
        let endpoints = source
            .get(&table::STORAGE_ACCOUNT_URL)?
            .map(|url| {
                account_endpoints(&url).map_err(|reason| SetupError::AccountUrl {
                    value: spot_worker_azure::redact(&url),
                    reason,
                })
            })
            .transpose()?;
        let connection_string = source.get(&table::CONNECTION_STRING)?;
        let client_id = source.get(&table::CLIENT_ID)?;
        let federated_token_file = source.get(&table::FEDERATED_TOKEN_FILE)?;
        let tenant_id = source.get(&table::TENANT_ID)?;
        let authority_host = source.get(&table::AUTHORITY_HOST)?;
        let credentials = Credentials::choose(
            CredentialSettings {
                connection_string: connection_string.as_deref(),
                client_id: client_id.as_deref(),
                federated_token_file: federated_token_file.as_deref(),
                tenant_id: tenant_id.as_deref(),
                authority_host: authority_host.as_deref(),
            },
            endpoints,
        )?;
        tracing::info!(
            credential = credentials.kind(),
            "storage credentials chosen"
        );
        let scale_in = if source.get(&table::SCALE_IN_PROTECTION)? {
            // The identity that reaches storage by token, else the VM's
            // managed identity (storage by connection string).
            let credential = match credentials.token_credential() {
                Some(credential) => credential,
                None => Credentials::managed_identity_credential(
                    client_id.as_deref().map(str::to_owned),
                )?,
            };
            Some((credential, source.get(&table::SCALE_IN_IDLE_GRACE)?))
        } else {
            None
        };
        let storage = AzureStorage::new(adjust(StorageConfig::new(credentials)))?;
        Ok(AzureSetup {
            config,
            storage,
            scale_in,
        })
    }

    /// A worker on the configured queue (its lane's, with lanes:
    /// `SPOT_WORKER_REGULAR_QUEUE` for a regular-lane worker), the
    /// `<SPOT_WORKER_QUEUE>-poison` queue (the one poison queue of both
    /// lanes), the checkpoint container and the poison
    /// container (originals too big for their poison record); with
    /// `SPOT_WORKER_REGULAR_QUEUE` set, the two lanes (docs/deploying.md, "The two lanes"), the
    /// keeper's turns taken by a lease in the checkpoint container. Missing
    /// queues and containers are created by the warmup gate.
    pub fn worker(&self) -> Result<Worker, SetupError> {
        worker_on(&self.config, &self.storage, &self.scale_in)
    }
}

/// A worker configured by `config` on the queues and containers it names in
/// `storage`.
fn worker_on(
    config: &WorkerConfig,
    storage: &AzureStorage,
    scale_in: &ScaleIn,
) -> Result<Worker, SetupError> {
    let consumed = config.consumed_queue();
    let queue = storage.queue(consumed)?;
    // One poison queue for both lanes: the operator's poison commands see
    // every lane's, and a requeued job goes back to the Spot lane, where
    // the lane rule moves it again if it has no slack.
    let poison = storage.queue(&spot_worker_consumer::poison_queue_name(&config.queue))?;
    let checkpoints = Arc::new(storage.checkpoint_store(&config.checkpoint_container)?);
    let poison_bodies = storage.result_store(&config.poison_container)?;
    let worker = Worker::new(config.clone(), Arc::new(queue), Arc::new(poison))
        .with_checkpoints(checkpoints.clone())
        .with_poison_bodies(Arc::new(poison_bodies));
    let worker = match &config.lanes.regular_queue {
        Some(regular) => worker.with_lanes(
            Arc::new(storage.queue(&config.queue)?),
            Arc::new(storage.queue(regular)?),
            checkpoints,
        ),
        None => worker,
    };
    let Some((credential, idle_grace)) = scale_in else {
        return Ok(worker);
    };
    // This VM's instance is read from instance metadata on the first call.
    let imds = ImdsClient::new(ImdsConfig::default().with_endpoint(config.imds.endpoint.clone()))
        .map_err(|e| SetupError::ScaleInProtection(e.to_string()))?;
    let target = ArmScaleInProtection::from_imds(imds, Arc::clone(credential))
        .map_err(|e| SetupError::ScaleInProtection(e.to_string()))?;
    Ok(worker.with_scale_in_protection(Arc::new(target), *idle_grace))
}

/// What the account URL must look like, for error messages.
const EXPECTED: &str = "expected https://<account>.blob.<suffix> (e.g. \
    https://myaccount.blob.core.windows.net) or just the account name";

/// The blob and queue endpoints of an account given by one service URL
/// (`https://acct.blob.core.windows.net`, any cloud's suffix) or by name.
/// The error says why the text is not one, and what is expected.
pub fn account_endpoints(text: &str) -> Result<AccountEndpoints, String> {
    let text = text.trim().trim_end_matches('/');
    let Some((scheme, rest)) = text.split_once("://") else {
        check_account_name(text)?;
        return AccountEndpoints::for_account(text).map_err(|e| e.to_string());
    };
    match scheme.to_ascii_lowercase().as_str() {
        "https" => {}
        "http" => {
            return Err(format!(
                "plain http is refused: the managed identity's bearer token would travel in \
                 clear (a local emulator is reached with AZURE_STORAGE_CONNECTION_STRING instead); {EXPECTED}"
            ));
        }
        other => return Err(format!("unsupported scheme {other:?}; {EXPECTED}")),
    }
    if rest.contains(['/', '?', '#', '@']) {
        return Err(format!(
            "only the account's service URL, without path, query or credentials; {EXPECTED}"
        ));
    }
    let mut labels: Vec<&str> = rest.split('.').collect();
    let service_url = labels.len() >= 3
        && matches!(labels[1], "blob" | "queue" | "table" | "file" | "dfs")
        && labels.iter().all(|label| !label.is_empty());
    if !service_url {
        return Err(EXPECTED.to_owned());
    }
    check_account_name(labels[0])?;
    labels[1] = "blob";
    let blob = format!("https://{}", labels.join("."));
    labels[1] = "queue";
    let queue = format!("https://{}", labels.join("."));
    AccountEndpoints::new(&blob, &queue).map_err(|e| e.to_string())
}

/// Storage account names: 3 to 24 lowercase letters and digits.
fn check_account_name(name: &str) -> Result<(), String> {
    let valid = (3..=24).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if valid {
        return Ok(());
    }
    // Text with URL or SAS punctuation may hold a signature or a password
    // (a URL pasted without its scheme): it is not repeated.
    let shown = if name.contains(['/', '?', '#', '@', ':', '&', '=', ';']) {
        "the value".to_owned()
    } else {
        format!("{name:?}")
    };
    Err(format!(
        "{shown} is not a storage account name (3 to 24 lowercase letters and digits); {EXPECTED}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_from_any_service_url_or_a_name() {
        for given in [
            "https://acct.blob.core.windows.net",
            "https://acct.queue.core.windows.net/",
            "acct",
        ] {
            let e = account_endpoints(given).unwrap();
            assert_eq!(
                e.blob.as_str(),
                "https://acct.blob.core.windows.net/",
                "{given}"
            );
            assert_eq!(
                e.queue.as_str(),
                "https://acct.queue.core.windows.net/",
                "{given}"
            );
        }
        let china = account_endpoints("https://acct.blob.core.chinacloudapi.cn").unwrap();
        assert_eq!(
            china.queue.as_str(),
            "https://acct.queue.core.chinacloudapi.cn/"
        );
        assert!(account_endpoints("https://example.com").is_err());
    }

    #[test]
    fn bad_account_urls_say_why() {
        let cases = [
            ("http://acct.blob.core.windows.net", "plain http is refused"),
            (
                "http://127.0.0.1:10000/devstoreaccount1",
                "plain http is refused",
            ),
            ("ftp://acct.blob.core.windows.net", "unsupported scheme"),
            (
                "https://acct.blob.core.windows.net/container",
                "without path",
            ),
            (
                "https://acct.blob.core.windows.net?sv=1",
                "without path, query",
            ),
            ("https://example.com", "expected https://<account>.blob"),
            (
                "https://Acct.blob.core.windows.net",
                "not a storage account name",
            ),
            (
                "https://a.blob.core.windows.net",
                "not a storage account name",
            ),
            ("my_account", "not a storage account name"),
            ("https://acct.blob..net", "expected https://<account>.blob"),
        ];
        for (given, expected) in cases {
            let reason = account_endpoints(given).unwrap_err();
            assert!(reason.contains(expected), "{given}: {reason}");
        }
    }

    /// The whole chain, as `{:#}` (anyhow) or a `source()` walk prints it,
    /// says each cause once: `storage: no storage configured: ...`, not
    /// that twice.
    #[test]
    fn a_cause_is_said_once_in_the_chain() {
        let errors = [
            SetupError::from(spot_worker_azure::StorageConfigError::NotConfigured),
            SetupError::from(TelemetryError::InvalidLogFilter("x=[".to_owned())),
        ];
        for error in errors {
            let mut chain = vec![error.to_string()];
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                chain.push(cause.to_string());
                source = cause.source();
            }
            let text = chain.join(": ");
            let cause = match &error {
                SetupError::Storage(cause) => cause.to_string(),
                SetupError::Telemetry(cause) => cause.to_string(),
                _ => unreachable!(),
            };
            assert_eq!(text.matches(&cause).count(), 1, "{text}");
        }
    }

    #[test]
    fn the_error_names_the_variable() {
        let err = SetupError::AccountUrl {
            value: "http://acct.blob.core.windows.net".to_owned(),
            reason: account_endpoints("http://acct.blob.core.windows.net").unwrap_err(),
        };
        let text = err.to_string();
        assert!(
            text.starts_with("SPOT_WORKER_STORAGE_ACCOUNT_URL=\"http://acct.blob.core.windows.net\" is invalid: plain http"),
            "{text}"
        );
    }
}
