//! `spot-worker run [SETTINGS] -- PROGRAM [ARGS...]`: any program as a
//! Spot worker. The same worker as `examples/primes.rs` (warmup gate,
//! Scheduled Events watcher, consumer, leases, drain, approval, telemetry,
//! health), with `spot-worker-command`'s handler running PROGRAM once per
//! message. This file only wires; docs/command.md is the contract.

use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Args;
use spot_worker::Setup;
use spot_worker::settings::{CONFIG_FILE, Source, table};
use spot_worker::storage::ResultStore;
use spot_worker::storage::files::TransferLimits;
use spot_worker_command::{
    CommandConfig, CommandHandler, ProgramUser, parse_exit_codes, parse_output_level, parse_signal,
};

#[derive(Debug, Args)]
#[command(after_help = short_help(), after_long_help = long_help())]
pub struct RunArgs {
    /// Settings as flags (see below), then `--`, then the program to run
    /// per message and its arguments.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required = true,
        value_name = "SETTINGS... -- PROGRAM [ARGS]"
    )]
    raw: Vec<String>,
}

/// The settings `run -h` shows as examples, as `(flag, value)`: each one
/// parses (`the_help_examples_parse`), so a reader can copy it.
const EXAMPLES: &[(&str, &str)] = &[
    ("queue", "jobs"),
    ("job-key", "job_id"),
    ("result-name", "{job_key}.json"),
    ("permanent-exit-codes", "65"),
    ("timeout", "1h"),
    ("stop-signal", "SIGTERM"),
    ("checkpoint-every", "60s"),
    ("checkpoint-max-bytes", "274877906944"),
    ("result-max-bytes", "10737418240"),
    ("pass-env", "NAME"),
    ("program-output", "info"),
];

/// What `run -h` says after the options: a few settings, and where the rest
/// and the program's contract are.
fn short_help() -> String {
    let examples: Vec<String> = EXAMPLES
        .iter()
        .map(|(flag, value)| match *flag {
            "result-name" => format!("--{flag} '{value}'"),
            "pass-env" => format!("--{flag} {value} (repeatable)"),
            "checkpoint-every" => format!("--{flag} {value} (default: adaptive)"),
            _ => format!("--{flag} {value}"),
        })
        .collect();
    format!(
        "Settings: any row of docs/configuration.md as a flag ({}; `--help` lists every one), \
         above the environment and the SPOT_WORKER_CONFIG file. Durations: 250ms, 30s, 2m, 1h \
         or 7d. The program's contract (stdin, SPOT_WORKER_* variables, checkpoint and result \
         files, exit statuses, signals): docs/command.md.",
        examples.join(", ")
    )
}

/// What `run --help` says after the options: the same, then every setting
/// with its variable, default and meaning (credentials as variables only:
/// `run` refuses them as flags).
fn long_help() -> String {
    format!(
        "{}\n\n{}",
        short_help(),
        spot_worker::settings::help(spot_worker::settings::SecretFlags::Refused)
    )
}

impl RunArgs {
    /// The settings before the first `--`, and the program with its
    /// arguments after it.
    fn split(self) -> anyhow::Result<(Vec<String>, Vec<String>)> {
        let mut raw = self.raw;
        // Clap takes a `--` that comes first for itself: what is left is
        // the program (whose name never starts with `-`).
        if raw.first().is_some_and(|first| !first.starts_with('-')) {
            return Ok((Vec::new(), raw));
        }
        let Some(at) = raw.iter().position(|arg| arg == "--") else {
            bail!("put `--` before the program: spot-worker run [SETTINGS] -- PROGRAM [ARGS...]");
        };
        let command = raw.split_off(at + 1);
        raw.pop();
        if command.is_empty() {
            bail!(
                "name the program to run after `--`: spot-worker run [SETTINGS] -- PROGRAM [ARGS...]"
            );
        }
        Ok((raw, command))
    }
}

/// Runs the worker until it is drained (an eviction notice, SIGTERM).
/// `log` and `imds_endpoint` are the command's global flags, if given.
pub async fn run(
    args: RunArgs,
    log: Option<String>,
    imds_endpoint: Option<String>,
) -> anyhow::Result<()> {
    let (flags, command) = args.split()?;
    let Some((program, program_args)) = command.split_first() else {
        bail!("name the program to run after `--`");
    };
    // A credential among the flags would be in this process's command line,
    // which every program reads in /proc/<ppid>/cmdline: refused.
    let mut settings = Source::from_env()?
        .with_args(join_repeated(flags, "pass-env"))?
        .without_secret_flags()?;
    if let Some(log) = log {
        settings = settings.with_flag(&table::LOG_FILTER, &log);
    }
    if let Some(endpoint) = imds_endpoint {
        settings = settings.with_flag(&table::IMDS_ENDPOINT, &endpoint);
    }
    let config = command_config(&settings, program, program_args)?;
    // Logs (always), telemetry (when configured) and storage.
    let setup = Setup::from_source(&settings).context("setting up")?;
    if let Some(user) = &config.program_user {
        // Before anything is started: a runner that cannot switch users
        // must not run programs as its own.
        let warning = user
            .check_runner()
            .with_context(|| format!("{} {}", table::PROGRAM_USER.key, user.name))?;
        if let Some(warning) = warning {
            tracing::warn!("{warning}");
        }
        tracing::info!(user = %user.name, uid = user.uid, gid = user.gid, "programs run as another user than the runner");
    }
    match spot_worker_command::become_subreaper() {
        // Orphans that left their program's group are reaped too.
        Ok(()) => drop(spot_worker_command::spawn_orphan_reaper()),
        Err(error) => {
            tracing::warn!(%error, "not a child subreaper: orphans of programs go to init")
        }
    }
    // The credentials stay in this process: no program of the same user
    // reads them from /proc/<runner>/environ.
    if let Err(error) = spot_worker_command::hide_from_programs() {
        tracing::warn!(%error, "programs may read this process's environment from /proc");
    }
    // What a runner killed outright (SIGKILL) left behind: its programs
    // died with it, but not what they had started.
    let swept = spot_worker_command::sweep_leftovers(config.work_root.as_deref());
    if swept.directories > 0 || swept.processes > 0 {
        tracing::warn!(
            directories = swept.directories,
            processes = swept.processes,
            "cleaned up after a runner that was killed: its delivery directories and what still ran in them"
        );
    }
    if swept.foreign > 0 {
        tracing::info!(
            directories = swept.foreign,
            "left alone delivery directories of runners of another PID namespace, boot or user (or of an earlier layout)"
        );
    }
    if let Some(why) = swept.blind {
        tracing::warn!("looked for no leftovers of a killed runner: {why}");
    }
    say_withheld(&config);
    let container = settings.get(&table::RESULTS_CONTAINER)?;
    let results: Arc<dyn ResultStore> = Arc::new(
        setup
            .storage
            .result_store(&container)?
            .with_transfer_concurrency(config.transfer.concurrency),
    );
    let warmup_results = Arc::clone(&results);
    let worker = setup.worker()?.with_warmup(move || {
        let results = Arc::clone(&warmup_results);
        async move { Ok(results.prepare().await?) }
    });
    tracing::info!(program = %config.program.display(), args = ?config.args, "running a program per message");
    let report = worker
        .run(CommandHandler::new(config, results))
        .await
        .context("running the worker")?;
    tracing::info!(
        trigger = %report.drain.trigger,
        notice_to_drained_ms = report.drain.notice_to_drained.as_millis() as u64,
        processed = report.stats.succeeded,
        released = report.stats.released,
        "stopped"
    );
    Ok(())
}

/// The handler's configuration from the settings.
fn command_config(
    settings: &Source,
    program: &str,
    program_args: &[String],
) -> anyhow::Result<CommandConfig> {
    let codes = settings.get(&table::PERMANENT_EXIT_CODES)?;
    let codes = parse_exit_codes(&codes)
        .map_err(|reason| settings.invalid(&table::PERMANENT_EXIT_CODES, reason))?;
    let signal = settings.get(&table::STOP_SIGNAL)?;
    let signal =
        parse_signal(&signal).map_err(|reason| settings.invalid(&table::STOP_SIGNAL, reason))?;
    let pass_env = settings
        .get(&table::PASS_ENV)?
        .map(|names| {
            names
                .split(',')
                .map(str::trim)
                .filter(|name| !name.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let output = settings.get(&table::PROGRAM_OUTPUT)?;
    let output = parse_output_level(&output)
        .map_err(|reason| settings.invalid(&table::PROGRAM_OUTPUT, reason))?;
    let result_name = settings.get(&table::RESULT_NAME)?;
    if result_name.trim().is_empty() {
        return Err(settings.invalid(&table::RESULT_NAME, "empty").into());
    }
    let mut config = CommandConfig::new(program, program_args.iter().cloned())
        .with_result_name(result_name.into_owned())
        .with_permanent_exit_codes(codes)
        .with_timeout(settings.get(&table::TIMEOUT)?)
        .with_stop_signal(signal)
        .with_checkpoint_max_bytes(settings.get(&table::CHECKPOINT_MAX_BYTES)?)
        .with_result_max_bytes(settings.get(&table::RESULT_MAX_BYTES)?)
        .with_transfer_limits(transfer_limits(settings)?)
        .with_pass_env(pass_env)
        .with_output_level(output)
        // The table's credentials, the file that may hold them, and whatever
        // the storage redaction would hide.
        .with_secret_rule(withheld_from_programs);
    // Unset: the worker's adaptive interval (docs/checkpoint-interval.md).
    if let Some(every) = settings.get(&table::CHECKPOINT_EVERY)? {
        config = config.with_checkpoint_every(every);
    }
    if let Some(marker) = settings.get(&table::CHECKPOINT_MARKER)? {
        config = config
            .with_checkpoint_marker(marker.into_owned())
            .map_err(|reason| settings.invalid(&table::CHECKPOINT_MARKER, reason))?;
    }
    if let Some(field) = settings.get(&table::JOB_KEY)? {
        config = config.with_job_key(field.into_owned());
    }
    if let Some(user) = settings.get(&table::PROGRAM_USER)? {
        let user = ProgramUser::lookup(&user)
            .map_err(|reason| settings.invalid(&table::PROGRAM_USER, reason.to_string()))?;
        config = config.with_program_user(user);
    }
    Ok(config)
}

/// `SPOT_WORKER_TRANSFER_CONCURRENCY` as the runner's transfer limits.
fn transfer_limits(settings: &Source) -> anyhow::Result<TransferLimits> {
    let concurrency = settings.get(&table::TRANSFER_CONCURRENCY)?;
    if !(1..=64).contains(&concurrency) {
        return Err(settings
            .invalid(&table::TRANSFER_CONCURRENCY, "must be 1 to 64")
            .into());
    }
    Ok(TransferLimits::with_concurrency(concurrency as usize))
}

/// Whether the variable `name` (with `value`) is kept from programs, beyond
/// the command crate's rule for names that look like credentials: the
/// settings the table marks secret, `SPOT_WORKER_CONFIG` (the path of a
/// file that may hold them), and any value the storage redaction would
/// hide.
fn withheld_from_programs(name: &str, value: &str) -> bool {
    name == CONFIG_FILE
        || table::ALL
            .iter()
            .any(|setting| setting.secret() && setting.key() == name)
        || spot_worker_azure::redact(value) != value
}

/// Names (never values) the variables of this process that programs do
/// not get, so that a program missing one can be told why.
fn say_withheld(config: &CommandConfig) {
    let withheld =
        spot_worker_command::withheld_names(std::env::vars_os(), &*config.secret, &config.pass_env);
    if withheld.is_empty() {
        return;
    }
    tracing::info!(
        variables = %withheld.join(","),
        "kept from programs as credentials (pass one on purpose with --pass-env NAME)"
    );
}

/// `--NAME a --NAME b` (or `--NAME=a`) as one `--NAME a,b`, so a repeatable
/// flag becomes the one comma-separated setting.
fn join_repeated(args: Vec<String>, name: &str) -> Vec<String> {
    let flag = format!("--{name}");
    let inline = format!("--{name}=");
    let mut values = Vec::new();
    let mut rest = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == flag {
            values.extend(args.next());
        } else if let Some(value) = arg.strip_prefix(&inline) {
            values.push(value.to_owned());
        } else {
            rest.push(arg);
        }
    }
    if !values.is_empty() {
        rest.push(flag);
        rest.push(values.join(","));
    }
    rest
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|&a| a.to_owned()).collect()
    }

    #[test]
    fn settings_then_the_program() {
        let split = |raw: &[&str]| {
            RunArgs { raw: strings(raw) }
                .split()
                .map_err(|e| e.to_string())
        };
        assert_eq!(
            split(&["--queue", "q", "--", "python3", "--x"]),
            Ok((strings(&["--queue", "q"]), strings(&["python3", "--x"])))
        );
        assert_eq!(
            split(&["python3", "--", "--x"]),
            Ok((vec![], strings(&["python3", "--", "--x"])))
        );
        assert!(split(&["--queue", "q"]).unwrap_err().contains("put `--`"));
        assert!(
            split(&["--queue", "q", "--"])
                .unwrap_err()
                .contains("name the program")
        );
    }

    /// `run -h` shows these as examples: each is a setting whose value
    /// parses, and the handler's configuration accepts them all.
    #[test]
    fn the_help_examples_parse() {
        let args: Vec<String> = EXAMPLES
            .iter()
            .flat_map(|(flag, value)| [format!("--{flag}"), (*value).to_owned()])
            .collect();
        let settings = Source::defaults()
            .with_args(join_repeated(args, "pass-env"))
            .unwrap();
        let config = command_config(&settings, "python3", &[]).unwrap();
        assert_eq!(config.timeout, Some(std::time::Duration::from_secs(3600)));
        let help = short_help();
        for (flag, value) in EXAMPLES {
            assert!(help.contains(&format!("--{flag} ")), "{flag}");
            assert!(help.contains(value), "{value}");
        }
        let long = long_help();
        for setting in spot_worker::settings::table::ALL {
            assert!(long.contains(setting.key()), "{}", setting.key());
        }
    }

    #[test]
    fn a_repeated_flag_becomes_one_list() {
        let rows: [(&[&str], &[&str]); 3] = [
            (&["--queue", "q"], &["--queue", "q"]),
            (
                &["--pass-env", "A", "--queue", "q", "--pass-env=B"],
                &["--queue", "q", "--pass-env", "A,B"],
            ),
            (&["--pass-env", "A"], &["--pass-env", "A"]),
        ];
        for (given, expected) in rows {
            assert_eq!(join_repeated(strings(given), "pass-env"), strings(expected));
        }
    }

    #[test]
    fn settings_make_the_handler_config() {
        let args = strings(&[
            "--job-key",
            "job_id",
            "--permanent-exit-codes",
            "65,78",
            "--stop-signal",
            "INT",
            "--timeout",
            "2m",
            "--pass-env",
            "A,B",
            "--program-output",
            "off",
        ]);
        let settings = Source::defaults().with_args(args).unwrap();
        let config = command_config(&settings, "python3", &strings(&["job.py"])).unwrap();
        assert_eq!(config.job_key_field.as_deref(), Some("job_id"));
        assert_eq!(config.permanent_exit_codes, [65, 78]);
        assert_eq!(config.stop_signal, libc_sigint());
        assert_eq!(config.timeout, Some(std::time::Duration::from_secs(120)));
        assert_eq!(config.pass_env, ["A", "B"]);
        assert_eq!(config.output_level, None);
        assert_eq!(config.args, ["job.py"]);
        let bad = Source::defaults()
            .with_args(strings(&["--stop-signal", "SIGNOPE"]))
            .unwrap();
        let err = command_config(&bad, "x", &[]).unwrap_err().to_string();
        assert!(err.contains("SIGNOPE"), "{err}");
    }

    #[test]
    fn the_tables_secrets_and_the_config_file_are_withheld() {
        let rows = [
            (
                "AZURE_STORAGE_CONNECTION_STRING",
                "UseDevelopmentStorage=true",
                true,
            ),
            (
                "APPLICATIONINSIGHTS_CONNECTION_STRING",
                "InstrumentationKey=x",
                true,
            ),
            ("SPOT_WORKER_CONFIG", "/etc/spot-worker/worker.toml", true),
            (
                "BLOB_URL",
                "https://a.blob.core.windows.net/c/b?sv=1&sig=abc",
                true,
            ),
            ("SPOT_WORKER_QUEUE", "jobs", false),
            ("HOME", "/home/me", false),
        ];
        for (name, value, withheld) in rows {
            assert_eq!(withheld_from_programs(name, value), withheld, "{name}");
        }
    }

    fn libc_sigint() -> i32 {
        spot_worker_command::parse_signal("SIGINT").unwrap()
    }
}
