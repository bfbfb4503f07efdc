//! The pieces of `tests/it/storage_permissions.rs`: Azurite's debug log read
//! as requests ([`azurite_log`]), and a [`Recorder`] that tells which of
//! them one command issued.

pub mod azurite_log;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use spot_worker::azure::AzureStorage;
use spot_worker_testkit::Azurite;

use azurite_log::{Request, requests, rest_operation};

/// Bound on waiting for Azurite's log to catch up.
const LOG_PATIENCE: Duration = Duration::from_secs(60);

/// One storage operation on one resource, as the permission check reads it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Operation {
    /// The REST operation's name in Microsoft's permission table.
    pub operation: String,
    /// `queue`, `container`, or `account` (a service-level operation).
    pub on: String,
    /// The queue's or container's name (empty for the account).
    pub name: String,
}

impl Operation {
    /// As `tools/infra/storage-operations-used.json` keeps it.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"operation": self.operation, "on": self.on, "name": self.name})
    }
}

/// The operations of each command, as JSON.
pub fn by_command(
    commands: &std::collections::BTreeMap<String, Vec<Operation>>,
) -> serde_json::Value {
    commands
        .iter()
        .map(|(name, ops)| {
            let ops: Vec<serde_json::Value> = ops.iter().map(Operation::to_json).collect();
            (name.clone(), serde_json::Value::Array(ops))
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Splits Azurite's log into what each command issued: before and after a
/// command, it sends a marker request (Get Queue Metadata of a queue named
/// `marker-N`, which does not exist) and waits until Azurite has logged it.
/// Everything logged between two markers came from what ran between them:
/// the command had finished, so its requests were all served, before the
/// marker was sent.
pub struct Recorder<'a> {
    azurite: &'a Azurite,
    storage: AzureStorage,
    markers: u32,
    /// Requests already handed out or discarded.
    seen: usize,
}

impl<'a> Recorder<'a> {
    pub fn new(azurite: &'a Azurite, storage: AzureStorage) -> Self {
        Recorder {
            azurite,
            storage,
            markers: 0,
            seen: 0,
        }
    }

    /// Forgets everything logged so far (the test's own requests).
    pub async fn discard(&mut self) {
        self.since_last().await;
    }

    /// The distinct operations logged since the last marker, sorted; fails
    /// on a request Azurite could not dispatch or the table does not know.
    pub async fn operations(&mut self) -> Vec<Operation> {
        let mut found = BTreeSet::new();
        for request in self.since_last().await {
            let azurite = request.azurite_operation.clone().unwrap_or_else(|| {
                panic!("Azurite did not dispatch request {request:?} to any operation")
            });
            let operation = rest_operation(request.service, &azurite).unwrap_or_else(|| {
                panic!(
                    "Azurite operation {azurite} ({}) is not in tests/it/permissions/azurite_log.rs's table: \
                     add it with its name in storage-operations.json",
                    request.service
                )
            });
            let on = match (request.resource.is_empty(), request.service) {
                (true, _) => "account",
                (false, "queue") => "queue",
                (false, _) => "container",
            };
            found.insert(Operation {
                operation: operation.to_owned(),
                on: on.to_owned(),
                name: request.resource.clone(),
            });
        }
        found.into_iter().collect()
    }

    async fn since_last(&mut self) -> Vec<Request> {
        self.markers += 1;
        let marker = format!("marker-{}", self.markers);
        let queue = self.storage.queue(&marker).expect("a marker queue name");
        let missing = queue.approximate_message_count().await;
        assert!(missing.is_err(), "the marker queue {marker} must not exist");
        let started = Instant::now();
        loop {
            let all = requests(&self.azurite.debug_log());
            if let Some(at) = all
                .iter()
                .skip(self.seen)
                .position(|r| r.service == "queue" && r.resource == marker)
            {
                let at = self.seen + at;
                let between = all[self.seen..at].to_vec();
                self.seen = at + 1;
                // Markers of earlier calls are not the commands' requests.
                return between
                    .into_iter()
                    .filter(|r| !(r.service == "queue" && r.resource.starts_with("marker-")))
                    .collect();
            }
            assert!(
                started.elapsed() < LOG_PATIENCE,
                "Azurite's debug log did not show the marker request {marker} within {LOG_PATIENCE:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
