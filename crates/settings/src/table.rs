//! Every setting, in the order docs/configuration.md lists them.
//!
//! A crate reads its settings by these constants (`table::DRAIN_BUDGET`),
//! never by building a variable name, so that searching for
//! `SPOT_WORKER_DRAIN_BUDGET` finds this line and every reader.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use crate::setting::{Describe, Setting};

/// Text settings.
type Text = Cow<'static, str>;

const fn text(value: &'static str) -> Text {
    Cow::Borrowed(value)
}

const fn seconds(n: u64) -> Duration {
    Duration::from_secs(n)
}

// Storage.

/// Storage by connection string.
pub const CONNECTION_STRING: Setting<Option<Text>> = Setting {
    key: "AZURE_STORAGE_CONNECTION_STRING",
    default: None,
    default_doc: None,
    doc: "storage by connection string (`UseDevelopmentStorage=true` for Azurite); a secret, never logged",
    secret: true,
};

/// The storage account reached with a managed identity.
pub const STORAGE_ACCOUNT_URL: Setting<Option<Text>> = Setting {
    key: "SPOT_WORKER_STORAGE_ACCOUNT_URL",
    default: None,
    default_doc: None,
    doc: "otherwise the account (`https://<acct>.blob.core.windows.net` or its name), `https://` only (a local Azurite is reached with the connection string); reached with the user-assigned managed identity `AZURE_CLIENT_ID` names, else with the Azure CLI's login (`az login`): a VM's system-assigned identity alone is not used",
    secret: false,
};

/// The user-assigned managed identity.
pub const CLIENT_ID: Setting<Option<Text>> = Setting {
    key: "AZURE_CLIENT_ID",
    default: None,
    default_doc: None,
    doc: "the user-assigned managed identity's client id (on AKS: the workload identity's, set by its webhook); unset, storage by account URL uses the Azure CLI's login",
    secret: false,
};

/// The workload identity's projected service-account token.
pub const FEDERATED_TOKEN_FILE: Setting<Option<Text>> = Setting {
    key: "AZURE_FEDERATED_TOKEN_FILE",
    default: None,
    default_doc: None,
    doc: "a projected service-account token (set by the AKS workload identity webhook): storage with workload identity, as `AZURE_CLIENT_ID` in `AZURE_TENANT_ID`; re-read when it changes",
    secret: false,
};

/// The workload identity's tenant.
pub const TENANT_ID: Setting<Option<Text>> = Setting {
    key: "AZURE_TENANT_ID",
    default: None,
    default_doc: None,
    doc: "the tenant of the workload identity (set by the webhook)",
    secret: false,
};

/// Where workload identity exchanges its token.
pub const AUTHORITY_HOST: Setting<Option<Text>> = Setting {
    key: "AZURE_AUTHORITY_HOST",
    default: None,
    default_doc: Some("`https://login.microsoftonline.com/`"),
    doc: "the Microsoft Entra ID endpoint workload identity asks for tokens (set by the webhook); `https://` only",
    secret: false,
};

// The queue and its consumer.

/// The queue to consume.
pub const QUEUE: Setting<Text> = Setting {
    key: "SPOT_WORKER_QUEUE",
    default: text("jobs"),
    default_doc: None,
    doc: "queue to consume; poison queue `<queue>-poison`",
    secret: false,
};

/// How message text encodes bodies.
pub const MESSAGE_ENCODING: Setting<Text> = Setting {
    key: "SPOT_WORKER_MESSAGE_ENCODING",
    default: text("text"),
    default_doc: None,
    doc: "or `base64` (Azure Functions / WebJobs)",
    secret: false,
};

/// Messages handled at once.
pub const CONCURRENCY: Setting<Option<usize>> = Setting {
    key: "SPOT_WORKER_CONCURRENCY",
    default: None,
    default_doc: Some("CPUs"),
    doc: "messages handled at once",
    secret: false,
};

/// Lease length.
pub const VISIBILITY_TIMEOUT: Setting<Duration> = Setting {
    key: "SPOT_WORKER_VISIBILITY_TIMEOUT",
    default: seconds(30),
    default_doc: None,
    doc: "lease length (5 s to 7 days), renewed every third of it: a job of N minutes costs about 3·N / timeout renewals",
    secret: false,
};

/// Handler failures before the poison queue.
pub const MAX_FAILURES: Setting<u32> = Setting {
    key: "SPOT_WORKER_MAX_FAILURES",
    default: 5,
    default_doc: None,
    doc: "handler failures before the poison queue (evictions never count; see [Delivery semantics](lifecycle.md#delivery-semantics))",
    secret: false,
};

/// The crash-loop guard.
pub const MAX_DELIVERIES: Setting<u32> = Setting {
    key: "SPOT_WORKER_MAX_DELIVERIES",
    default: 100,
    default_doc: None,
    doc: "crash-loop guard: deliveries without a recorded outcome before the poison queue",
    secret: false,
};

/// Longest pause between receives on an empty queue.
pub const IDLE_POLL_MAX: Setting<Duration> = Setting {
    key: "SPOT_WORKER_IDLE_POLL_MAX",
    default: seconds(1),
    default_doc: None,
    doc: "longest pause between receives on an empty queue (bounds release-to-redelivery)",
    secret: false,
};

/// How long a refusing store is waited out before intake pauses.
pub const STORAGE_REFUSAL_GRACE: Setting<Duration> = Setting {
    key: "SPOT_WORKER_STORAGE_REFUSAL_GRACE",
    default: seconds(30),
    default_doc: None,
    doc: "how long the checkpoint store may refuse one kind of request (401/403) or miss its container before the worker turns not ready and pauses intake; shorter refusals are waited out uncounted, like outages (see [Delivery semantics](lifecycle.md#delivery-semantics))",
    secret: false,
};

/// What a worker VM costs, for each job's cost in money.
pub const PRICE_PER_HOUR: Setting<Option<Text>> = Setting {
    key: "SPOT_WORKER_PRICE_PER_HOUR",
    default: None,
    default_doc: None,
    doc: "`status`: a Spot worker VM's price per hour in US dollars (a number, e.g. `0.0125`), shared by its `SPOT_WORKER_CONCURRENCY` slots; with it each job's time is also shown as money, storage requests included (see [Goodput](goodput.md)); a regular VM's is `SPOT_WORKER_REGULAR_PRICE_PER_HOUR`",
    secret: false,
};

// Lanes: jobs with a deadline on Spot, or regular capacity when they must
// (docs/deploying.md, "The two lanes").

/// The lane this worker serves.
pub const LANE: Setting<Text> = Setting {
    key: "SPOT_WORKER_LANE",
    default: text("spot"),
    default_doc: None,
    doc: "the lane this worker serves: `spot` (it consumes `SPOT_WORKER_QUEUE`) or `regular` (it consumes `SPOT_WORKER_REGULAR_QUEUE`, on regular-priority VMs); see [the two lanes](deploying.md#the-two-lanes)",
    secret: false,
};

/// The regular lane's queue.
pub const REGULAR_QUEUE: Setting<Option<Text>> = Setting {
    key: "SPOT_WORKER_REGULAR_QUEUE",
    default: None,
    default_doc: None,
    doc: "the regular lane's queue (e.g. `jobs-regular`; both lanes poison into `<SPOT_WORKER_QUEUE>-poison`), where jobs with a deadline go when the lane rule says they must; unset: no lanes, and a job with a deadline runs where it was sent",
    secret: false,
};

/// Take part in keeping the lanes.
pub const LANE_KEEPER: Setting<bool> = Setting {
    key: "SPOT_WORKER_LANE_KEEPER",
    default: true,
    default_doc: None,
    doc: "with lanes: take turns (one worker of the fleet at a time, by a blob lease) at moving to the regular lane the jobs waiting in the Spot lane that `SPOT_WORKER_LANE_POLICY` sends there (`uniform-progress`: behind their line; `patient`: behind it once the Spot outage has outlasted what the job can afford to wait out), after the fleet's usual queue wait (at once for the safety net)",
    secret: false,
};

/// How often the lanes are looked at.
pub const LANE_KEEPER_EVERY: Setting<Duration> = Setting {
    key: "SPOT_WORKER_LANE_KEEPER_EVERY",
    default: seconds(60),
    default_doc: None,
    doc: "with lanes: how often the lane keeper looks at the Spot lane, and a job running on regular capacity is checked (back to Spot once ahead of its line); the lane rule keeps this much more slack",
    secret: false,
};

/// The switch cost assumed until the fleet measured its own.
pub const SWITCH_COST: Setting<Duration> = Setting {
    key: "SPOT_WORKER_SWITCH_COST",
    default: seconds(360),
    default_doc: None,
    doc: "with lanes: d, what one switch of lane costs a job (queue wait, start-up, restore, lost work), assumed until the fleet's own measurements outweigh it; split in the proportions of the default",
    secret: false,
};

/// Which rule picks a job's lane.
pub const LANE_POLICY: Setting<Text> = Setting {
    key: "SPOT_WORKER_LANE_POLICY",
    default: text("patient"),
    default_doc: None,
    doc: "with lanes: the rule that picks a job's lane: `patient` (Uniform Progress that learns from the fleet's Spot outages how long a job can afford to wait one out, and goes back to Spot only for runs worth a switch) or `uniform-progress` (the paper's rule as it stands); both keep the safety net and never move a job that runs on Spot; see [the patient policy](deadlines.md#the-patient-policy-the-default)",
    secret: false,
};

/// What a regular VM costs.
pub const REGULAR_PRICE_PER_HOUR: Setting<Option<Text>> = Setting {
    key: "SPOT_WORKER_REGULAR_PRICE_PER_HOUR",
    default: None,
    default_doc: None,
    doc: "`status`: a regular-priority worker VM's price per hour in US dollars, for the jobs' hours in the regular lane (with `SPOT_WORKER_PRICE_PER_HOUR` for their Spot hours)",
    secret: false,
};

/// Blob container for checkpoints.
pub const CHECKPOINT_CONTAINER: Setting<Text> = Setting {
    key: "SPOT_WORKER_CHECKPOINT_CONTAINER",
    default: text("checkpoints"),
    default_doc: None,
    doc: "blob container for checkpoints",
    secret: false,
};

/// Blob container for poisoned originals.
pub const POISON_CONTAINER: Setting<Text> = Setting {
    key: "SPOT_WORKER_POISON_CONTAINER",
    default: text("poison"),
    default_doc: None,
    doc: "blob container for poisoned originals too big for their record",
    secret: false,
};

/// Blob container for results (the `primes` worker).
pub const RESULTS_CONTAINER: Setting<Text> = Setting {
    key: "SPOT_WORKER_RESULTS_CONTAINER",
    default: text("results"),
    default_doc: None,
    doc: "blob container for results (the `primes` worker and `spot-worker run`)",
    secret: false,
};

// A program as the job (`spot-worker run -- PROGRAM`, docs/command.md).

/// The body field that keys a command's job.
pub const JOB_KEY: Setting<Option<Text>> = Setting {
    key: "SPOT_WORKER_JOB_KEY",
    default: None,
    default_doc: Some("the message id"),
    doc: "`run`: the field of a JSON body that keys checkpoints and results (e.g. `job_id`, so duplicates share them); the program sees the key itself under this name",
    secret: false,
};

/// The name a command's result is stored under.
pub const RESULT_NAME: Setting<Text> = Setting {
    key: "SPOT_WORKER_RESULT_NAME",
    default: text("{job_key}"),
    default_doc: None,
    doc: "`run`: the result blob's name; `{job_key}` and `{message_id}` are replaced",
    secret: false,
};

/// Exit statuses that poison at once.
pub const PERMANENT_EXIT_CODES: Setting<Text> = Setting {
    key: "SPOT_WORKER_PERMANENT_EXIT_CODES",
    default: text("65"),
    default_doc: None,
    doc: "`run`: exit statuses (comma-separated) that poison the message at once; 65 is `EX_DATAERR`",
    secret: false,
};

/// The longest a command may run per delivery.
pub const TIMEOUT: Setting<Option<Duration>> = Setting {
    key: "SPOT_WORKER_TIMEOUT",
    default: None,
    default_doc: None,
    doc: "`run`: the longest a program may run per delivery; then it is killed and the delivery counts as a failure",
    secret: false,
};

/// The signal a drain starts with.
pub const STOP_SIGNAL: Setting<Text> = Setting {
    key: "SPOT_WORKER_STOP_SIGNAL",
    default: text("SIGTERM"),
    default_doc: None,
    doc: "`run`: the signal the program's process group gets when the drain starts (SIGKILL follows at the release time less 1 s, or less half the time left if that is shorter: the runner saves the checkpoint file in between)",
    secret: false,
};

/// A fixed checkpoint interval; unset, it adapts.
pub const CHECKPOINT_EVERY: Setting<Option<Duration>> = Setting {
    key: "SPOT_WORKER_CHECKPOINT_EVERY",
    default: None,
    default_doc: Some("adaptive"),
    doc: "a fixed checkpoint interval instead of the adaptive one (Daly's, from the measured cost of a save and the fleet's interruptions that lose work: docs/checkpoint-interval.md); what `JobCheckpoint::is_due` follows, and for `run` the least time between two saves of a changed checkpoint file (it is also saved when the program ends)",
    secret: false,
};

/// The commit marker of `run`'s checkpoint directory.
pub const CHECKPOINT_MARKER: Setting<Option<Text>> = Setting {
    key: "SPOT_WORKER_CHECKPOINT_MARKER",
    default: None,
    default_doc: Some("none"),
    doc: "`run`: a file in `SPOT_WORKER_CHECKPOINT_DIR` (a relative path) the program writes last, once its files are one state: the directory is saved only when the marker has changed, and only as it was when the marker was written (see [A directory saved as one state](command.md#a-directory-saved-as-one-state))",
    secret: false,
};

/// The eviction rate assumed before the fleet has history.
pub const EVICTION_RATE: Setting<f64> = Setting {
    key: "SPOT_WORKER_EVICTION_RATE",
    default: 0.05,
    default_doc: None,
    doc: "evictions per VM-hour the adaptive checkpoint interval assumes until the fleet's own counts outweigh it (it counts as 100 job-hours of observation); the top of the VM size's eviction-rate band, which Azure quotes per hour: `0.05` for 0–5 % (docs/checkpoint-interval.md)",
    secret: false,
};

/// The largest checkpoint saved (the file and the directory together).
pub const CHECKPOINT_MAX_BYTES: Setting<u64> = Setting {
    key: "SPOT_WORKER_CHECKPOINT_MAX_BYTES",
    default: 274_877_906_944,
    default_doc: Some("`274877906944` (256 GiB)"),
    doc: "`run`: the largest checkpoint saved (the checkpoint file and directory together, streamed in chunks: the runner's memory does not grow with it); a bigger one stops the program and counts as a failure",
    secret: false,
};

/// The largest result file stored.
pub const RESULT_MAX_BYTES: Setting<u64> = Setting {
    key: "SPOT_WORKER_RESULT_MAX_BYTES",
    default: 10_737_418_240,
    default_doc: Some("`10737418240` (10 GiB)"),
    doc: "`run`: the largest result file stored (streamed in blocks); a bigger one, found on exit 0 before anything is read, counts as a failure with its size and this limit",
    secret: false,
};

/// Transfers at once when a checkpoint or result is saved or restored.
pub const TRANSFER_CONCURRENCY: Setting<u64> = Setting {
    key: "SPOT_WORKER_TRANSFER_CONCURRENCY",
    default: 8,
    default_doc: None,
    doc: "`run`: uploads (or downloads) at once when a checkpoint's chunks or a result's blocks are saved or restored; the bytes held in memory for them stay under 16 MiB whatever this is",
    secret: false,
};

/// Variables passed to the program although they look like credentials.
pub const PASS_ENV: Setting<Option<Text>> = Setting {
    key: "SPOT_WORKER_PASS_ENV",
    default: None,
    default_doc: None,
    doc: "`run`: variables (comma-separated; `--pass-env` may be repeated) the program gets even though they look like credentials",
    secret: false,
};

/// The level of a command's output in the worker's log.
pub const PROGRAM_OUTPUT: Setting<Text> = Setting {
    key: "SPOT_WORKER_PROGRAM_OUTPUT",
    default: text("info"),
    default_doc: None,
    doc: "`run`: the level of the program's output records in the worker's log (`error`, `warn`, `info`, `debug`, `trace`), or `off`; `\\r` ends a record like `\\n`, and progress records (ended by a lone `\\r`) are logged at most once a second per stream",
    secret: false,
};

/// The user programs run as.
pub const PROGRAM_USER: Setting<Option<Text>> = Setting {
    key: "SPOT_WORKER_PROGRAM_USER",
    default: None,
    default_doc: Some("the runner's user"),
    doc: "`run`: the user programs run as, a name of `/etc/passwd` or `UID[:GID]`, never root: the only complete separation from the runner's settings file, token file, rendezvous directory and process; the runner keeps its own user and credentials, and needs root's powers to switch (see [Running programs as another user](command.md#running-programs-as-another-user))",
    secret: false,
};

// Health and the warmup gate.

/// Where the health endpoints listen.
pub const HEALTH_ADDR: Setting<SocketAddr> = Setting {
    key: "SPOT_WORKER_HEALTH_ADDR",
    default: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8080),
    default_doc: None,
    doc: "`/healthz` and `/readyz`",
    secret: false,
};

/// Give up if the gate stays closed this long.
pub const GATE_TIMEOUT: Setting<Option<Duration>> = Setting {
    key: "SPOT_WORKER_GATE_TIMEOUT",
    default: None,
    default_doc: None,
    doc: "exit with an error if the gate stays closed this long (unset: wait as long as it takes)",
    secret: false,
};

// Scheduled Events.

/// Watch Scheduled Events at all.
pub const IMDS: Setting<bool> = Setting {
    key: "SPOT_WORKER_IMDS",
    default: true,
    default_doc: None,
    doc: "`off` only on machines that are not Azure VMs",
    secret: false,
};

/// The IMDS base URL.
pub const IMDS_ENDPOINT: Setting<Text> = Setting {
    key: "SPOT_WORKER_IMDS_ENDPOINT",
    default: text("http://169.254.169.254"),
    default_doc: None,
    doc: "IMDS (an emulator's URL for rehearsals)",
    secret: false,
};

/// The Scheduled Events poll interval.
pub const IMDS_POLL_INTERVAL: Setting<Duration> = Setting {
    key: "SPOT_WORKER_IMDS_POLL_INTERVAL",
    default: seconds(1),
    default_doc: None,
    doc: "how often Scheduled Events are polled; retries after a failure wait at most this long",
    secret: false,
};

/// This VM's name in `Resources`.
pub const VM_NAME: Setting<Option<Text>> = Setting {
    key: "SPOT_WORKER_VM_NAME",
    default: None,
    default_doc: Some("from instance metadata"),
    doc: "this VM's name in `Resources`; the warmup gate does not wait for instance metadata then, and a name it contradicts when it answers is refused (the worker drains and stops with an error)",
    secret: false,
};

// Scale-in on AKS: this pod's deletion cost (docs/deploying.md, "How a
// scale-in picks the pod").

/// Keep this pod's `controller.kubernetes.io/pod-deletion-cost`.
pub const POD_DELETION_COST: Setting<bool> = Setting {
    key: "SPOT_WORKER_POD_DELETION_COST",
    default: true,
    default_doc: None,
    doc: "in a pod (`SPOT_WORKER_POD_NAME` set): keep the pod's `controller.kubernetes.io/pod-deletion-cost` equal to its unsaved work (0 when idle), so a scale-in removes an idle pod before a busy one; needs the service-account token and a Role allowing `patch` on pods (deploy/kubernetes/pod-deletion-cost.yaml). Without `SPOT_WORKER_POD_NAME` nothing is done",
    secret: false,
};

/// How coarse the pod's deletion cost is, and how often it may change.
pub const POD_DELETION_COST_STEP: Setting<Duration> = Setting {
    key: "SPOT_WORKER_POD_DELETION_COST_STEP",
    default: seconds(60),
    default_doc: None,
    doc: "a busy pod's deletion cost is its unsaved seconds rounded down to a multiple of this, and changes at most once per this long while it stays busy (KEP-2255 advises against updating it on every small step); between idle and busy it changes at once",
    secret: false,
};

/// This pod's name.
pub const POD_NAME: Setting<Option<Text>> = Setting {
    key: "SPOT_WORKER_POD_NAME",
    default: None,
    default_doc: None,
    doc: "this pod's name (from the downward API, `metadata.name`): set only in a Kubernetes pod",
    secret: false,
};

/// This pod's namespace.
pub const POD_NAMESPACE: Setting<Option<Text>> = Setting {
    key: "SPOT_WORKER_POD_NAMESPACE",
    default: None,
    default_doc: None,
    doc: "this pod's namespace (from the downward API, `metadata.namespace`); required with `SPOT_WORKER_POD_NAME`",
    secret: false,
};

/// The Kubernetes API server's address, as the kubelet sets it.
pub const KUBERNETES_SERVICE_HOST: Setting<Option<Text>> = Setting {
    key: "KUBERNETES_SERVICE_HOST",
    default: None,
    default_doc: None,
    doc: "the API server's address (set in every pod by the kubelet); reached over HTTPS only",
    secret: false,
};

/// The Kubernetes API server's port, as the kubelet sets it.
pub const KUBERNETES_SERVICE_PORT: Setting<Option<u32>> = Setting {
    key: "KUBERNETES_SERVICE_PORT",
    default: None,
    default_doc: Some("443"),
    doc: "the API server's HTTPS port (set in every pod by the kubelet)",
    secret: false,
};

/// Where the pod's service-account token and the cluster's CA are.
pub const SERVICE_ACCOUNT_DIR: Setting<Text> = Setting {
    key: "SPOT_WORKER_SERVICE_ACCOUNT_DIR",
    default: text("/var/run/secrets/kubernetes.io/serviceaccount"),
    default_doc: None,
    doc: "the directory of the pod's service-account `token` (re-read for every call; never logged) and the cluster CA `ca.crt` the API server's certificate is checked against",
    secret: false,
};

// Shutdown.

/// The longest drain after any notice.
pub const DRAIN_BUDGET: Setting<Duration> = Setting {
    key: "SPOT_WORKER_DRAIN_BUDGET",
    default: seconds(25),
    default_doc: None,
    doc: "longest drain after any notice; the longest drain (this, or margin + floor) plus 2 s to exit must fit the unit's `TimeoutStopSec=28s`, so at most `26s`",
    secret: false,
};

/// Release running handlers this long before the hard deadline.
pub const RELEASE_MARGIN: Setting<Duration> = Setting {
    key: "SPOT_WORKER_RELEASE_MARGIN",
    default: seconds(3),
    default_doc: None,
    doc: "release running handlers this long before the hard deadline",
    secret: false,
};

/// The time the release always gets.
pub const RELEASE_FLOOR: Setting<Duration> = Setting {
    key: "SPOT_WORKER_RELEASE_FLOOR",
    default: seconds(2),
    default_doc: None,
    doc: "time the release always gets, however late the notice (at most the margin)",
    secret: false,
};

/// Approve the triggering event once drained.
pub const APPROVE_EVENTS: Setting<bool> = Setting {
    key: "SPOT_WORKER_APPROVE_EVENTS",
    default: true,
    default_doc: None,
    doc: "approve the triggering event once drained, if it lists this VM alone",
    secret: false,
};

/// Also approve events listing other VMs.
pub const APPROVE_SHARED_EVENTS: Setting<bool> = Setting {
    key: "SPOT_WORKER_APPROVE_SHARED_EVENTS",
    default: false,
    default_doc: None,
    doc: "also approve events listing other VMs (starts them for those VMs too)",
    secret: false,
};

/// Where the workers on one VM meet before approving.
pub const RUNTIME_DIR: Setting<Option<Text>> = Setting {
    key: "SPOT_WORKER_RUNTIME_DIR",
    default: None,
    default_doc: Some("`/run/spot-worker`, else `$XDG_RUNTIME_DIR/spot-worker`"),
    doc: "where the workers on one VM meet (a locked file each): an event is approved only once every one has drained; without a usable directory, only at its deadline (see [Several workers on one VM](operating.md#several-workers-on-one-vm))",
    secret: false,
};

/// End the process if the drain overruns.
pub const WATCHDOG: Setting<bool> = Setting {
    key: "SPOT_WORKER_WATCHDOG",
    default: true,
    default_doc: None,
    doc: "end the process if the drain overruns, or if it is still up 1 s after the worker stopped",
    secret: false,
};

// Scale-in (issue 39).

/// Keep this VM protected from scale-in while it holds work.
pub const SCALE_IN_PROTECTION: Setting<bool> = Setting {
    key: "SPOT_WORKER_SCALE_IN_PROTECTION",
    default: false,
    default_doc: None,
    doc: "on a VM of a scale set: protect this VM from scale-in (`protectFromScaleIn`, through Azure Resource Manager with the worker's managed identity) from its first message of a busy period until it has been idle for `SPOT_WORKER_SCALE_IN_IDLE_GRACE`, and release it on exit; needs the custom role of the template's `scaleInProtection` (see [Expected cost shape](deploying.md#expected-cost-shape))",
    secret: false,
};

/// How long a worker must be idle before its VM may be scaled in.
pub const SCALE_IN_IDLE_GRACE: Setting<Duration> = Setting {
    key: "SPOT_WORKER_SCALE_IN_IDLE_GRACE",
    default: seconds(120),
    default_doc: None,
    doc: "with `SPOT_WORKER_SCALE_IN_PROTECTION`: how long the worker holds nothing before its VM's protection is released (a gap between two messages is not idleness: one protect and one release per busy period)",
    secret: false,
};

// The fleet's bill (issue 39).

/// How long a gone worker's lifetime record is kept.
pub const LIFETIME_RETENTION: Setting<Duration> = Setting {
    key: "SPOT_WORKER_LIFETIME_RETENTION",
    default: seconds(30 * 86_400),
    default_doc: Some("`30d`"),
    doc: "how long a worker's lifetime record (the fleet's bill, `.spot-worker/fleet/workers/`) is kept after the worker last wrote it; each worker, once its record is first written, deletes at most 50 records older than this (see [How to read the bill](deploying.md#how-to-read-the-bill))",
    secret: false,
};

// Telemetry (standard OpenTelemetry variables where there is one).

/// The stderr log filter.
pub const LOG_FILTER: Setting<Text> = Setting {
    key: "RUST_LOG",
    default: text("info"),
    default_doc: None,
    doc: "stderr log filter (`tracing` directives); spans below it are not exported",
    secret: false,
};

/// Text or JSON logs.
pub const LOG_FORMAT: Setting<Text> = Setting {
    key: "SPOT_WORKER_LOG_FORMAT",
    default: text("text"),
    default_doc: None,
    doc: "or `json` for structured log lines; text has ANSI colours only when stderr is a terminal and `NO_COLOR` is unset or empty",
    secret: false,
};

/// `service.name`.
pub const SERVICE_NAME: Setting<Text> = Setting {
    key: "OTEL_SERVICE_NAME",
    default: text("spot-worker"),
    default_doc: None,
    doc: "`service.name` of exported spans and metrics",
    secret: false,
};

/// OTLP/HTTP collector.
pub const OTLP_ENDPOINT: Setting<Option<Text>> = Setting {
    key: "OTEL_EXPORTER_OTLP_ENDPOINT",
    default: None,
    default_doc: None,
    doc: "OTLP/HTTP collector base URL (`/v1/traces`, `/v1/metrics` appended)",
    secret: false,
};

/// OTLP protocol; only one is supported.
pub const OTLP_PROTOCOL: Setting<Text> = Setting {
    key: "OTEL_EXPORTER_OTLP_PROTOCOL",
    default: text("http/protobuf"),
    default_doc: None,
    doc: "the only protocol supported",
    secret: false,
};

/// Upper bound of one export.
pub const OTLP_TIMEOUT: Setting<u64> = Setting {
    key: "OTEL_EXPORTER_OTLP_TIMEOUT",
    default: 10_000,
    default_doc: None,
    doc: "upper bound of one export request, in ms",
    secret: false,
};

/// How often metrics are pushed.
pub const METRIC_EXPORT_INTERVAL: Setting<u64> = Setting {
    key: "OTEL_METRIC_EXPORT_INTERVAL",
    default: 60_000,
    default_doc: None,
    doc: "how often metrics are pushed, in ms",
    secret: false,
};

/// Application Insights.
pub const APP_INSIGHTS: Setting<Option<Text>> = Setting {
    key: "APPLICATIONINSIGHTS_CONNECTION_STRING",
    default: None,
    default_doc: None,
    doc: "export to Application Insights (checked at start-up; the key is never logged)",
    secret: true,
};

/// No exporter at all.
pub const SDK_DISABLED: Setting<bool> = Setting {
    key: "OTEL_SDK_DISABLED",
    default: false,
    default_doc: None,
    doc: "`true`: logs only, no exporter",
    secret: false,
};

/// Every setting, in the order of docs/configuration.md.
pub const ALL: &[&dyn Describe] = &[
    &CONNECTION_STRING,
    &STORAGE_ACCOUNT_URL,
    &CLIENT_ID,
    &FEDERATED_TOKEN_FILE,
    &TENANT_ID,
    &AUTHORITY_HOST,
    &QUEUE,
    &MESSAGE_ENCODING,
    &CONCURRENCY,
    &VISIBILITY_TIMEOUT,
    &MAX_FAILURES,
    &MAX_DELIVERIES,
    &IDLE_POLL_MAX,
    &STORAGE_REFUSAL_GRACE,
    &PRICE_PER_HOUR,
    &LANE,
    &REGULAR_QUEUE,
    &LANE_KEEPER,
    &LANE_KEEPER_EVERY,
    &LANE_POLICY,
    &SWITCH_COST,
    &REGULAR_PRICE_PER_HOUR,
    &CHECKPOINT_CONTAINER,
    &POISON_CONTAINER,
    &RESULTS_CONTAINER,
    &JOB_KEY,
    &RESULT_NAME,
    &PERMANENT_EXIT_CODES,
    &TIMEOUT,
    &STOP_SIGNAL,
    &CHECKPOINT_EVERY,
    &CHECKPOINT_MARKER,
    &EVICTION_RATE,
    &CHECKPOINT_MAX_BYTES,
    &RESULT_MAX_BYTES,
    &TRANSFER_CONCURRENCY,
    &PASS_ENV,
    &PROGRAM_OUTPUT,
    &PROGRAM_USER,
    &HEALTH_ADDR,
    &GATE_TIMEOUT,
    &IMDS,
    &IMDS_ENDPOINT,
    &IMDS_POLL_INTERVAL,
    &VM_NAME,
    &POD_DELETION_COST,
    &POD_DELETION_COST_STEP,
    &POD_NAME,
    &POD_NAMESPACE,
    &KUBERNETES_SERVICE_HOST,
    &KUBERNETES_SERVICE_PORT,
    &SERVICE_ACCOUNT_DIR,
    &DRAIN_BUDGET,
    &RELEASE_MARGIN,
    &RELEASE_FLOOR,
    &APPROVE_EVENTS,
    &APPROVE_SHARED_EVENTS,
    &RUNTIME_DIR,
    &WATCHDOG,
    &SCALE_IN_PROTECTION,
    &SCALE_IN_IDLE_GRACE,
    &LIFETIME_RETENTION,
    &LOG_FILTER,
    &LOG_FORMAT,
    &SERVICE_NAME,
    &OTLP_ENDPOINT,
    &OTLP_PROTOCOL,
    &OTLP_TIMEOUT,
    &METRIC_EXPORT_INTERVAL,
    &APP_INSIGHTS,
    &SDK_DISABLED,
];

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::setting::file_key;

    #[test]
    fn keys_and_file_keys_are_unique() {
        let keys: HashSet<_> = ALL.iter().map(|s| s.key()).collect();
        assert_eq!(keys.len(), ALL.len());
        let file_keys: HashSet<_> = ALL.iter().map(|s| file_key(s.key())).collect();
        assert_eq!(file_keys.len(), ALL.len());
        assert!(!keys.contains(crate::CONFIG_FILE));
    }

    #[test]
    fn every_default_reads_back_as_itself() {
        for setting in ALL {
            let shown = setting.default_text();
            if let Some(text) = shown.strip_prefix('`').and_then(|s| s.strip_suffix('`')) {
                assert_eq!(setting.check(text), Ok(()), "{}", setting.key());
            }
        }
    }

    #[test]
    fn the_credentials_are_marked_secret() {
        let secrets: Vec<_> = ALL.iter().filter(|s| s.secret()).map(|s| s.key()).collect();
        assert_eq!(
            secrets,
            [CONNECTION_STRING.key, APP_INSIGHTS.key],
            "a setting that carries a key or token is secret"
        );
    }
}
