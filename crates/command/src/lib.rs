//! # spot-worker-command
//!
//! Any program as a spot-worker job. [`CommandHandler`] is a
//! [`MessageHandler`](spot_worker_consumer::MessageHandler) that runs a
//! program once per message: the body on stdin, the job's progress in a
//! checkpoint file the runner saves (fenced, like every checkpoint), its
//! result in a result file stored create-only, the drain's notice as a
//! signal to its process group and a notice file, its exit status turned
//! into done, retry or poison by ordered rules ([`verdict`]), its output in
//! the worker's log, and the worker's credentials kept from it.
//! `spot-worker run -- PROGRAM` wires it into a worker; docs/command.md is
//! the contract. A process running programs this way should also call
//! [`become_subreaper`], [`spawn_orphan_reaper`], [`hide_from_programs`]
//! and [`sweep_leftovers`] once, as the CLI does.

mod config;
mod delivery;
mod env;
mod exit;
mod files;
mod group;
mod handler;
mod inherit;
mod kept_until;
mod leftovers;
mod look;
mod output;
mod pace;
mod program_user;
mod progress;
mod reaper;
mod runner_id;
mod save_cost;
mod settle;
mod spawner;
mod sqlite_version;
mod store_refusal;
mod throughput;
mod trouble;
mod version_files;
mod write_time;

pub use config::{
    CommandConfig, DEFAULT_CHECKPOINT_EVERY, DEFAULT_CHECKPOINT_MAX_BYTES,
    DEFAULT_PERMANENT_EXIT_CODES, DEFAULT_RESULT_MAX_BYTES, DEFAULT_RESULT_NAME,
};
pub use delivery::{FIRST_SAVE_LOOK, GRACE_WITHOUT_DEADLINE, SAVE_MARGIN};
pub use env::{SecretRule, child_env, is_secret, withheld_names};
pub use exit::{
    ExitStatus, RunnerEnded, Verdict, parse_exit_codes, parse_signal, signal_name, verdict,
};
pub use group::{become_subreaper, hide_from_programs};
pub use handler::{CommandHandler, key_of};
pub use leftovers::{Leftovers, sweep_leftovers};
pub use output::{MAX_LINE, PROGRESS_EVERY, STDERR_TAIL, parse_output_level};
pub use pace::{ProgressFileError, parse_progress};
pub use program_user::{ProgramUser, ProgramUserError};
pub use progress::{ProgressError, from_progress, read_stable, read_stable_version, to_progress};
pub use reaper::{SWEEP_EVERY, reap_orphans, spawn_orphan_reaper};
pub use save_cost::{VersionFile, Written, save_cost, written};
pub use settle::{FIRST_RETRY, LONGEST_RETRY, REPORT_AFTER, retry_after};
pub use sqlite_version::{
    BUSY_WAITS, BackupError, COMPANIONS, Copies, SQLITE_HEADER, STEP_PAGES, STEPWISE_TRIES,
    with_consistent_databases,
};
pub use write_time::Unmeasured;
