//! `spot-worker enqueue`: JSON Lines in, one queue message per line; or,
//! with `--raw`, the whole input as one message (a body that is not JSON,
//! for a program that reads text on its stdin).
//!
//! Each line is sent exactly as written (without its line break), encoded
//! as the worker expects (`SPOT_WORKER_MESSAGE_ENCODING`). A bad line is
//! reported by its number and the rest still go out; the command then
//! exits non-zero. Sends run concurrently, so messages reach the queue in
//! roughly, not exactly, the file's order.
//!
//! With `--deadline` and `--work` every job carries a deadline (in an
//! envelope around its body, which the worker unwraps: the program reads
//! the body as written) and goes to the lane the lane rule picks
//! (`lanes.rs`, docs/deploying.md, "The two lanes").
//!
//! It never creates the queue: the deployment does (or a worker, at its
//! start), and a mistyped `SPOT_WORKER_QUEUE` must not send jobs into a new
//! queue no worker reads. Sending is also all the operator's role on the
//! queue allows (Storage Queue Data Message Sender). A missing queue stops
//! the run at once, saying so.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use spot_worker_storage::{MessageEncoding, MessageQueue as _, StorageError, unsendable_char};
use tokio::io::{AsyncBufReadExt as _, AsyncRead, BufReader};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::{Fleet, encoding_name};
use lanes::{Routing, deadline_of, rfc3339};

mod lanes;
mod send;
mod summary;

use send::{Existing, Outcome, Sender, missing_queue};
use summary::{Progress, Summary};

/// Put jobs on the queue: one message per line of JSON Lines.
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  spot-worker enqueue jobs.jsonl
  generate-jobs | spot-worker enqueue -
  spot-worker enqueue --skip-existing --results results jobs.jsonl   # a safe re-run
  spot-worker enqueue --queue texts --raw chapter-1.txt              # one message, any text
  spot-worker enqueue --deadline 52h --work 48h jobs.jsonl           # due in 52 h, 48 h of work each

Each line is one JSON document, sent as is. With --skip-existing every line
needs a string `job_id` field (as the worker's job key), and a line whose job
already has a completed checkpoint (or, with --results, a result blob) is
skipped, so re-running after an interruption sends only what is missing.
A worker whose result marks a job done (primes) deletes its checkpoint as
it finishes: for it, give --results. A
job still in progress is sent again: if its message is still queued, the
worker's per-job checkpoint fencing lets only one of the two run it.

A `job_id` under `.spot-worker/` (where the workers keep their own records)
is refused, and so is a body beginning `spot-worker-probe/` or
`spot-worker-job/` (what a worker reads as its own probe or deadline envelope).

With --raw the whole input, whatever it holds, is one message, byte for byte
(line breaks included): what `spot-worker run` gives its program on stdin. A
text queue carries UTF-8 only; SPOT_WORKER_MESSAGE_ENCODING=base64 carries any
bytes.

With --deadline and --work (needs SPOT_WORKER_REGULAR_QUEUE) every job carries
its deadline in an envelope the worker takes off before the program reads the
body, and goes to the Spot lane, or straight to the regular lane if even
running from now on leaves less slack than the lane rule keeps (docs/deploying.md, \"The two lanes\").")]
pub struct EnqueueArgs {
    /// JSON Lines file (with --raw: any file); `-` or nothing reads stdin.
    input: Option<PathBuf>,
    /// The queue to send to, instead of SPOT_WORKER_QUEUE.
    #[arg(long, value_name = "NAME")]
    queue: Option<String>,
    /// Send the whole input as one message, exactly as it is, not as JSON
    /// Lines.
    #[arg(long, conflicts_with = "skip_existing")]
    raw: bool,
    /// Sends in flight at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=256))]
    parallel: u16,
    /// Skip lines whose `job_id` already has a completed checkpoint (or a
    /// result, with --results).
    #[arg(long)]
    skip_existing: bool,
    /// Result container to check too with --skip-existing.
    #[arg(long, requires = "skip_existing", value_name = "CONTAINER")]
    results: Option<String>,
    /// Name of a job's result blob in --results; `{job_id}` is replaced.
    #[arg(long, default_value = "{job_id}.json", requires = "results")]
    result_name: String,
    /// When each job must be done: a time (2026-12-01T18:00:00Z) or a
    /// duration from now (52h).
    #[arg(long, value_name = "WHEN")]
    deadline: Option<String>,
    /// Each job's work, as the time it takes on one VM once started (an
    /// estimate; e.g. 48h). Goes with --deadline.
    #[arg(long, value_name = "DURATION", value_parser = spot_worker_runtime::parse_duration)]
    work: Option<std::time::Duration>,
}

/// One line of input, understood.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// Only whitespace: nothing to send.
    Blank,
    /// A job: the text to send, and its `job_id` if it has one.
    Job {
        text: String,
        job_id: Option<String>,
    },
}

/// Reads one raw line (line break included). `Err` says why it is bad.
fn parse_line(raw: &[u8], need_job_id: bool) -> Result<Line, String> {
    let raw = raw.strip_suffix(b"\n").unwrap_or(raw);
    let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
    let text = std::str::from_utf8(raw).map_err(|e| format!("not UTF-8: {e}"))?;
    if text.trim().is_empty() {
        return Ok(Line::Blank);
    }
    let document: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    // Valid JSON may hold U+FFFE or U+FFFF as they are; a queue message
    // cannot (JSON has no raw control character to refuse).
    if let Some((at, c)) = unsendable_char(text) {
        return Err(format!(
            "not sendable: U+{code:04X} at byte {at} is a character a queue message cannot carry \
             (XML 1.0); write it escaped in the JSON, as \\u{code:04x}",
            code = u32::from(c)
        ));
    }
    let job_id = match document.get("job_id") {
        Some(serde_json::Value::String(id)) if !id.is_empty() => {
            spot_worker_storage::refuse_reserved_key(id).map_err(|error| match error {
                StorageError::InvalidArgument(why) => why,
                other => other.to_string(),
            })?;
            Some(id.clone())
        }
        _ if need_job_id => {
            return Err("no non-empty string `job_id` field (--skip-existing needs one)".into());
        }
        _ => None,
    };
    Ok(Line::Job {
        text: text.to_owned(),
        job_id,
    })
}

pub async fn run(args: EnqueueArgs) -> Result<()> {
    // Checked here, not by clap's `requires`: clap's usage line for a
    // missing argument lists every one it was given, settings from the
    // environment included (`--imds-endpoint <IMDS_ENDPOINT>`), as if they
    // were required.
    let deadline = deadline_of(args.deadline.as_deref(), args.work)?;
    let mut fleet = Fleet::from_env()?;
    if let Some(name) = &args.queue {
        if name.trim().is_empty() {
            bail!("--queue needs a queue name");
        }
        fleet.config.queue.clone_from(name);
    }
    let routing = Routing::new(&fleet, deadline).await?;
    if args.raw {
        return send_raw(&fleet, &routing, args.input.as_deref()).await;
    }
    let existing = if args.skip_existing {
        let results = match &args.results {
            Some(container) => Some((fleet.blobs(container)?, args.result_name.clone())),
            None => None,
        };
        Some(Existing {
            checkpoints: fleet.checkpoints()?,
            results,
        })
    } else {
        None
    };
    let sender = Arc::new(Sender {
        routing,
        existing,
        queue_missing: Mutex::new(None),
    });
    let (input, total): (Box<dyn AsyncRead + Unpin + Send>, Option<u64>) = match &args.input {
        Some(path) if path.as_os_str() != "-" => {
            let file = tokio::fs::File::open(path)
                .await
                .with_context(|| format!("opening {}", path.display()))?;
            let len = file.metadata().await.ok().map(|m| m.len());
            (Box::new(file), len)
        }
        _ => (Box::new(tokio::io::stdin()), None),
    };
    let summary = send_all(
        input,
        &sender,
        usize::from(args.parallel),
        args.skip_existing,
        &Progress::new(total),
    )
    .await?;
    let sent = match (sender.routing.deadline(), sender.routing.regular()) {
        (Some(deadline), Some(regular)) => format!(
            "{} sent, due {} with {} of work each: {} to queue {} (the Spot lane), {} to queue {} \
             (the regular lane)",
            summary.sent,
            rfc3339(deadline.due),
            spot_worker_runtime::settings::show_duration(deadline.work),
            summary.sent - summary.regular,
            fleet.config.queue,
            summary.regular,
            regular.name()
        ),
        _ => format!("{} sent to queue {}", summary.sent, fleet.config.queue),
    };
    println!(
        "{sent} ({}), {} skipped as already done, {} bad, {} failed, {} blank",
        encoding_name(fleet.config.encoding),
        summary.skipped,
        summary.bad,
        summary.failed,
        summary.blank
    );
    if summary.late > 0 {
        eprintln!(
            "warning: for {} job(s) the time left is less than the work: sent to the regular \
             lane, they may still miss their deadline",
            summary.late
        );
    }
    if let Some(reason) = &summary.unread {
        bail!("{reason}; nothing after it was read (the summary above counts what was)");
    }
    if summary.bad > 0 || summary.failed > 0 {
        bail!(
            "{} bad line(s) and {} failed send(s), listed above by line number; \
             every other line was sent",
            summary.bad,
            summary.failed
        );
    }
    Ok(())
}

/// `--raw`: the whole input as one message, byte for byte.
async fn send_raw(fleet: &Fleet, routing: &Routing, input: Option<&std::path::Path>) -> Result<()> {
    let body = match input {
        Some(path) if path.as_os_str() != "-" => tokio::fs::read(path)
            .await
            .with_context(|| format!("reading {}", path.display()))?,
        _ => {
            let mut body = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut body)
                .await
                .context("reading stdin")?;
            body
        }
    };
    if body.is_empty() {
        bail!("the input is empty: nothing to send");
    }
    let encoding = fleet.config.encoding;
    let routed = routing.route(&body)?;
    let queue = routed.queue;
    let id = match queue
        .send_to_existing(&routed.text, std::time::Duration::ZERO)
        .await
    {
        Ok(id) => id,
        Err(StorageError::NotFound { .. }) => bail!("{}", missing_queue(queue.name())),
        Err(error) => {
            return Err(error).with_context(|| format!("sending to queue {:?}", queue.name()));
        }
    };
    let lane = match routing.deadline() {
        Some(deadline) => format!(
            ", the {} lane, due {}",
            routed.lane.as_str(),
            rfc3339(deadline.due)
        ),
        None => String::new(),
    };
    println!(
        "sent 1 message of {} byte(s) to queue {} ({}) as {}{lane}",
        body.len(),
        queue.name(),
        encoding_name(encoding),
        id.as_str()
    );
    if routed.late {
        eprintln!(
            "warning: the time left is less than the work: sent to the regular lane, it may \
             still miss its deadline"
        );
    }
    Ok(())
}

/// The message text that carries `body` exactly on a queue of `encoding`.
fn raw_message(body: &[u8], encoding: MessageEncoding) -> Result<String> {
    encoding.encode(body).map_err(encoding_refused)
}

/// Why a body cannot go on the queue, and the way out.
fn encoding_refused(error: StorageError) -> anyhow::Error {
    anyhow::anyhow!(
        "{error}: a text queue carries only UTF-8 text that XML 1.0 allows; send it to a queue \
         whose workers read base64 (SPOT_WORKER_MESSAGE_ENCODING=base64 for both), which \
         carries any bytes"
    )
}

/// Reads every line, sending jobs with at most `parallel` in flight.
async fn send_all(
    input: Box<dyn AsyncRead + Unpin + Send>,
    sender: &Arc<Sender>,
    parallel: usize,
    need_job_id: bool,
    progress: &Progress,
) -> Result<Summary> {
    let mut reader = BufReader::new(input);
    let slots = Arc::new(Semaphore::new(parallel));
    let mut tasks = JoinSet::new();
    let mut summary = Summary::default();
    let mut consumed = 0u64;
    let mut raw = Vec::new();
    for number in 1u64.. {
        if let Some(missing) = sender.queue_missing() {
            summary.unread = Some(missing);
            break;
        }
        raw.clear();
        let read = match reader.read_until(b'\n', &mut raw).await {
            Ok(read) => read,
            Err(e) => {
                // Sends already started still finish and are counted.
                summary.unread = Some(format!("reading line {number}: {e}"));
                break;
            }
        };
        if read == 0 {
            break;
        }
        consumed += read as u64;
        match parse_line(&raw, need_job_id) {
            Ok(Line::Blank) => summary.blank += 1,
            Ok(Line::Job { text, job_id }) => {
                let slot = Arc::clone(&slots).acquire_owned().await?;
                let sender = Arc::clone(sender);
                tasks.spawn(async move {
                    let outcome = sender.send(text, job_id).await;
                    drop(slot);
                    (number, outcome)
                });
            }
            Err(reason) => {
                summary.bad += 1;
                progress.report(&format!("line {number}: {reason}"));
            }
        }
        while let Some(done) = tasks.try_join_next() {
            settle(done?, &mut summary, progress);
        }
        progress.update(consumed, &summary);
    }
    while let Some(done) = tasks.join_next().await {
        settle(done?, &mut summary, progress);
    }
    progress.finish();
    Ok(summary)
}

fn settle((number, outcome): (u64, Outcome), summary: &mut Summary, progress: &Progress) {
    if let Outcome::Failed(reason) = &outcome {
        progress.report(&format!("line {number}: {reason}"));
    }
    summary.count(&outcome);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raw_body_is_carried_as_is_or_refused_with_the_way_out() {
        let text = "line 1\r\n\tline 2 <&> ü\n\nno newline at the end";
        assert_eq!(
            raw_message(text.as_bytes(), MessageEncoding::Text).unwrap(),
            text
        );
        let bytes = [0xff, 0x00, b'a'];
        assert_eq!(
            MessageEncoding::Base64
                .decode(&raw_message(&bytes, MessageEncoding::Base64).unwrap())
                .unwrap(),
            bytes
        );
        let refused = raw_message(&bytes, MessageEncoding::Text).unwrap_err();
        assert!(refused.to_string().contains("base64"), "{refused}");
        for text in ["a\x01b", "esc \x1b[2J", "\u{ffff}"] {
            let refused = raw_message(text.as_bytes(), MessageEncoding::Text)
                .unwrap_err()
                .to_string();
            assert!(
                refused.contains("cannot carry") && refused.contains("base64"),
                "{refused}"
            );
            assert!(raw_message(text.as_bytes(), MessageEncoding::Base64).is_ok());
        }
    }

    #[test]
    fn lines_are_sent_as_written_or_say_why_not() {
        let job = |text: &str, id: Option<&str>| {
            Ok(Line::Job {
                text: text.to_owned(),
                job_id: id.map(str::to_owned),
            })
        };
        let table: [(&[u8], bool, Result<Line, &str>); 13] = [
            (
                b"{\"job_id\":\"j1\"}\n",
                true,
                job("{\"job_id\":\"j1\"}", Some("j1")),
            ),
            (
                b"{\"job_id\":\"j1\"}\r\n",
                false,
                job("{\"job_id\":\"j1\"}", Some("j1")),
            ),
            (b"{ \"a\": 1 }", false, job("{ \"a\": 1 }", None)),
            (b"  \n", true, Ok(Line::Blank)),
            (b"{\"a\":1}\n", true, Err("`job_id`")),
            (b"{\"job_id\":7}\n", true, Err("`job_id`")),
            (b"{\"job_id\":\"\"}\n", true, Err("`job_id`")),
            (b"{oops\n", false, Err("not JSON")),
            (
                b"{\"job_id\":\".spot-worker/lanes/j1\"}\n",
                false,
                Err("is reserved for the workers' own records"),
            ),
            (
                b"{\"job_id\":\".spot-worker\"}\n",
                true,
                Err("\".spot-worker\""),
            ),
            (b"\xff\n", false, Err("not UTF-8")),
            (
                "{\"a\":\"\u{ffff}\"}\n".as_bytes(),
                false,
                Err("U+FFFF at byte 6"),
            ),
            (
                b"{\"a\":\"\\uffff\"}\n",
                false,
                job("{\"a\":\"\\uffff\"}", None),
            ),
        ];
        for (raw, need_job_id, expected) in table {
            let parsed = parse_line(raw, need_job_id);
            match (parsed, expected) {
                (Ok(line), Ok(expected)) => assert_eq!(line, expected),
                (Err(reason), Err(expected)) => assert!(reason.contains(expected), "{reason}"),
                (parsed, expected) => panic!("{raw:?}: {parsed:?} vs {expected:?}"),
            }
        }
    }
}

#[cfg(test)]
mod bad_input;
