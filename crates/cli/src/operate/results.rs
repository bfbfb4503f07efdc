//! `spot-worker results get NAME`: a job's result, as the worker stored it
//! in the results container (`SPOT_WORKER_RESULTS_CONTAINER`): `primes`
//! writes `<job_id>.json`, `spot-worker run` the program's result file
//! under `SPOT_WORKER_RESULT_NAME`.

use std::io::Write as _;

use anyhow::{Context as _, Result, bail};
use clap::{Args, Subcommand};
use spot_worker_storage::ResultStore as _;

use super::Fleet;

/// Read jobs' results.
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  spot-worker results get j1.json                  # a primes result
  spot-worker results get job-42 > job-42.out      # a program's result file, byte for byte

On a terminal, control characters (an escape sequence, a carriage return)
are shown escaped, as \\u{1b}; redirected or piped, the bytes are exact.

The container is SPOT_WORKER_RESULTS_CONTAINER (default `results`), or
--container. A result's name is the worker's: `<job_id>.json` for primes; for
`spot-worker run`, SPOT_WORKER_RESULT_NAME (default `{job_key}`: the job key,
which is the message id unless SPOT_WORKER_JOB_KEY names a field of the body).")]
pub struct ResultsArgs {
    #[command(subcommand)]
    command: ResultsCommand,
}

#[derive(Debug, Subcommand)]
enum ResultsCommand {
    /// Print one result on stdout, exactly as stored (on a terminal, with
    /// control characters escaped).
    #[command(after_help = "\
Examples:
  spot-worker results get j1.json                         # a primes result
  spot-worker results get job-42 > job-42.out             # a program's result file, byte for byte
  spot-worker results get --container renders frame-7    # another container than SPOT_WORKER_RESULTS_CONTAINER")]
    Get {
        /// The result's name in the container.
        name: String,
        /// The container, instead of SPOT_WORKER_RESULTS_CONTAINER.
        #[arg(long)]
        container: Option<String>,
    },
}

pub async fn run(args: ResultsArgs) -> Result<()> {
    let fleet = Fleet::from_env()?;
    match args.command {
        ResultsCommand::Get { name, container } => {
            let container = container.unwrap_or_else(|| fleet.results_container.clone());
            let store = fleet.blobs(&container)?;
            let Some(bytes) = store
                .get(&name)
                .await
                .with_context(|| format!("reading result {name:?} in container {container}"))?
            else {
                bail!(
                    "no result {name:?} in container {container} (not finished yet, or named \
                     otherwise: see `spot-worker results --help`)"
                );
            };
            let mut stdout = std::io::stdout().lock();
            // A program's bytes: exact when redirected, escaped on a terminal.
            stdout
                .write_all(&super::terminal::shown_bytes(&bytes))
                .context("writing the result")?;
            stdout.flush().context("writing the result")?;
            Ok(())
        }
    }
}
