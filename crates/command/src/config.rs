//! How the runner runs the program: [`CommandConfig`].

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use spot_worker_storage::files::TransferLimits;

use crate::env::{SecretRule, is_secret};
use crate::program_user::ProgramUser;

/// The default of `--permanent-exit-codes`: `EX_DATAERR` of sysexits.h.
pub const DEFAULT_PERMANENT_EXIT_CODES: [i32; 1] = [65];

/// The fixed interval `--checkpoint-every` had by default before the
/// interval adapted (docs/checkpoint-interval.md); also the adaptive
/// interval's least.
pub const DEFAULT_CHECKPOINT_EVERY: Duration = Duration::from_secs(10);

/// The default of `--checkpoint-max-bytes`: 256 GiB (the checkpoint is
/// streamed in chunks; the runner's memory does not grow with it).
pub const DEFAULT_CHECKPOINT_MAX_BYTES: u64 = 256 << 30;

/// The default of `--result-max-bytes`: 10 GiB (streamed in blocks).
pub const DEFAULT_RESULT_MAX_BYTES: u64 = 10 << 30;

/// The default of `--result-name`.
pub const DEFAULT_RESULT_NAME: &str = "{job_key}";

/// The program to run per message, and the rules it runs under (see
/// docs/command.md). Build it with [`CommandConfig::new`] and the `with_*`
/// setters.
#[derive(Clone)]
pub struct CommandConfig {
    /// The program (a path, or a name looked up in `PATH`).
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// The field of a JSON body that keys the job (`--job-key`); `None`:
    /// the message id.
    pub job_key_field: Option<String>,
    /// The result's name; `{job_key}` and `{message_id}` are replaced.
    pub result_name: String,
    /// Exit statuses that poison the message at once.
    pub permanent_exit_codes: Vec<i32>,
    /// The longest a program may run per delivery; then it is killed and the
    /// delivery counts as a failure.
    pub timeout: Option<Duration>,
    /// The signal the process group gets when the drain starts.
    pub stop_signal: i32,
    /// The least time between two saves of a changed checkpoint file.
    /// `None` (the default): the worker's checkpoint interval, adaptive
    /// unless the worker was given a fixed one
    /// ([`Job::cadence`](spot_worker_consumer::Job::cadence)); the program
    /// sees it as `SPOT_WORKER_CHECKPOINT_INTERVAL`.
    pub checkpoint_every: Option<Duration>,
    /// The commit marker: a file in the checkpoint directory (relative to
    /// it) the program writes last; the directory is saved only when it
    /// has changed, as it was when it was written (`settle.rs`). `None`:
    /// any read of the directory that held still is a version.
    pub checkpoint_marker: Option<String>,
    /// The largest checkpoint saved (file and directory together).
    pub checkpoint_max_bytes: u64,
    /// The largest result file stored.
    pub result_max_bytes: u64,
    /// Transfers and bytes in flight when a checkpoint is saved or
    /// restored.
    pub transfer: TransferLimits,
    /// Variables passed to the program even if the secret rule rejects them.
    pub pass_env: Vec<String>,
    /// Which of the worker's variables the program does not get.
    pub secret: SecretRule,
    /// Where the per-delivery directories go; `None`: the system's
    /// temporary directory.
    pub work_root: Option<PathBuf>,
    /// The level of the program's output records in the worker's log
    /// (`--program-output`); `None`: not logged (stderr's tail still goes
    /// into failure reasons).
    pub output_level: Option<tracing::Level>,
    /// The user programs run as (`--program-user`); `None`: the runner's.
    pub program_user: Option<ProgramUser>,
}

impl fmt::Debug for CommandConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CommandConfig")
            .field("program", &self.program)
            .field("args", &self.args)
            .field("job_key_field", &self.job_key_field)
            .field("result_name", &self.result_name)
            .field("permanent_exit_codes", &self.permanent_exit_codes)
            .field("timeout", &self.timeout)
            .field("stop_signal", &self.stop_signal)
            .field("checkpoint_every", &self.checkpoint_every)
            .field("checkpoint_marker", &self.checkpoint_marker)
            .field("checkpoint_max_bytes", &self.checkpoint_max_bytes)
            .field("result_max_bytes", &self.result_max_bytes)
            .field("transfer", &self.transfer)
            .field("pass_env", &self.pass_env)
            .field("work_root", &self.work_root)
            .field("output_level", &self.output_level)
            .field("program_user", &self.program_user)
            .finish_non_exhaustive()
    }
}

impl CommandConfig {
    /// Runs `program` with `args`, with every default of docs/command.md.
    pub fn new(
        program: impl Into<PathBuf>,
        args: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        CommandConfig {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            job_key_field: None,
            result_name: DEFAULT_RESULT_NAME.to_owned(),
            permanent_exit_codes: DEFAULT_PERMANENT_EXIT_CODES.to_vec(),
            timeout: None,
            stop_signal: libc::SIGTERM,
            checkpoint_every: None,
            checkpoint_marker: None,
            checkpoint_max_bytes: DEFAULT_CHECKPOINT_MAX_BYTES,
            result_max_bytes: DEFAULT_RESULT_MAX_BYTES,
            transfer: TransferLimits::DEFAULT,
            pass_env: Vec::new(),
            secret: Arc::new(is_secret),
            work_root: None,
            output_level: Some(tracing::Level::INFO),
            program_user: None,
        }
    }

    /// Keys jobs by `field` of a JSON body.
    pub fn with_job_key(mut self, field: impl Into<String>) -> Self {
        self.job_key_field = Some(field.into());
        self
    }

    /// Names results by `template` (`{job_key}`, `{message_id}`).
    pub fn with_result_name(mut self, template: impl Into<String>) -> Self {
        self.result_name = template.into();
        self
    }

    /// Sets the exit statuses that poison at once.
    pub fn with_permanent_exit_codes(mut self, codes: Vec<i32>) -> Self {
        self.permanent_exit_codes = codes;
        self
    }

    /// Kills a program that runs longer than `timeout`, as a failure.
    pub fn with_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the signal a drain starts with.
    pub fn with_stop_signal(mut self, signal: i32) -> Self {
        self.stop_signal = signal;
        self
    }

    /// Fixes the least time between two checkpoint saves, instead of the
    /// worker's interval.
    pub fn with_checkpoint_every(mut self, every: Duration) -> Self {
        self.checkpoint_every = Some(every);
        self
    }

    /// Names the checkpoint directory's commit marker, a path relative to
    /// it; an error (saying why) for a path outside it.
    pub fn with_checkpoint_marker(mut self, marker: impl Into<String>) -> Result<Self, String> {
        let marker = marker.into();
        crate::settle::check_marker_path(&marker)?;
        self.checkpoint_marker = Some(marker.trim_end_matches('/').to_owned());
        Ok(self)
    }

    /// Sets the largest checkpoint saved.
    pub fn with_checkpoint_max_bytes(mut self, limit: u64) -> Self {
        self.checkpoint_max_bytes = limit;
        self
    }

    /// Sets the largest result file stored.
    pub fn with_result_max_bytes(mut self, limit: u64) -> Self {
        self.result_max_bytes = limit;
        self
    }

    /// Saves and restores checkpoints with `limits`.
    pub fn with_transfer_limits(mut self, limits: TransferLimits) -> Self {
        self.transfer = limits;
        self
    }

    /// Passes these variables of the worker on to the program, secret or not.
    pub fn with_pass_env(mut self, names: Vec<String>) -> Self {
        self.pass_env = names;
        self
    }

    /// Rejects, in addition to the built-in rule, the variables `rule` says
    /// are secret.
    pub fn with_secret_rule(
        mut self,
        rule: impl Fn(&str, &str) -> bool + Send + Sync + 'static,
    ) -> Self {
        let built_in = Arc::clone(&self.secret);
        self.secret = Arc::new(move |name, value| built_in(name, value) || rule(name, value));
        self
    }

    /// Puts the per-delivery directories under `root`.
    pub fn with_work_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.work_root = Some(root.into());
        self
    }

    /// Logs the program's output at `level`, or not at all (`None`).
    pub fn with_output_level(mut self, level: Option<tracing::Level>) -> Self {
        self.output_level = level;
        self
    }

    /// Runs programs as `user` instead of the runner's user (check first
    /// that the runner can: [`ProgramUser::check_runner`]).
    pub fn with_program_user(mut self, user: ProgramUser) -> Self {
        self.program_user = Some(user);
        self
    }

    /// The result name for a job.
    pub fn result_name_for(&self, job_key: &str, message_id: &str) -> String {
        self.result_name
            .replace("{job_key}", job_key)
            .replace("{message_id}", message_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_names_fill_the_template() {
        let config = CommandConfig::new("true", Vec::<String>::new());
        assert_eq!(config.result_name_for("j1", "m1"), "j1");
        let config = config.with_result_name("out/{job_key}-{message_id}.json");
        assert_eq!(config.result_name_for("j1", "m1"), "out/j1-m1.json");
    }

    #[test]
    fn an_added_secret_rule_keeps_the_built_in_one() {
        let config = CommandConfig::new("true", Vec::<String>::new())
            .with_secret_rule(|name, _| name == "MY_API");
        assert!((config.secret)("MY_API", "x"));
        assert!((config.secret)("AZURE_CLIENT_ID", "x"));
        assert!(!(config.secret)("PATH", "/bin"));
    }
}
