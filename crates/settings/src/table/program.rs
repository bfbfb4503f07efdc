//! The settings of a program as the job (`spot-worker run -- PROGRAM`,
//! docs/command.md).

use std::time::Duration;

use crate::setting::Setting;

use super::{Text, text};

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
