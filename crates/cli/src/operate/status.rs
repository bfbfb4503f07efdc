//! `spot-worker status`: one screen for a fleet: the work queue and its
//! poison queue, the jobs in progress per their checkpoints, the finished
//! jobs' goodput per their completion records, the fleet's bill per the
//! workers' lifetime records, and, given their health URLs, whether the
//! workers are ready.

use std::io::IsTerminal as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use clap::Args;
use serde::Serialize;
use spot_worker_azure::AzureQueue;
use spot_worker_storage::StorageError;
use time::OffsetDateTime;

use super::checkpoints::{JobRow, ago, job_rows};
use super::goodput::{
    FleetGoodput, LaneAccounting, blended_price, job_cost, lane_accounting, parse_price,
    read_records, sum_up,
};
use super::saved_files;
use bill::{BillStatus, read_bill};
use failing::{FailingJobs, failing_jobs};
use interval::{IntervalStatus, interval_status};
use lanes::{LanesStatus, lanes_status};
use notices::{QueueNotices, notices_by_queue};
use save_trouble::{SaveTroubles, save_troubles};

mod bill;
mod failing;
mod interval;
mod lanes;
mod notices;
mod save_trouble;
use super::{Fleet, age, rfc3339, seconds_since};

/// Bound of one health request.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(5);

/// Show queue depths, the poison count, jobs in progress and readiness.
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  spot-worker status
  spot-worker status --health http://127.0.0.1:8080   # the worker on this machine
  spot-worker status --health http://127.0.0.1:8080 --health http://127.0.0.1:8081

A worker's health endpoint is where it listens (SPOT_WORKER_HEALTH_ADDR):
loopback on a scale-set VM (run status there), port 8080 of the pod on AKS
(`kubectl port-forward` it).
  spot-worker status --watch --interval 10s     # refresh until Ctrl-C
  spot-worker status --json | jq .queue.approximate_depth

A health URL without a path means its /readyz; a worker is ready when it
answers 200.")]
pub struct StatusArgs {
    /// A worker's health endpoint (repeat for each worker).
    #[arg(long = "health", value_name = "URL")]
    health: Vec<String>,
    /// Refresh every --interval until Ctrl-C (or --count refreshes).
    #[arg(long)]
    watch: bool,
    /// Time between refreshes with --watch.
    #[arg(long, default_value = "5s", value_parser = spot_worker_runtime::parse_duration)]
    interval: Duration,
    /// Stop --watch after this many screens.
    #[arg(long, requires = "watch")]
    count: Option<u64>,
    /// One JSON document per screen (one line each with --watch).
    #[arg(long)]
    json: bool,
    /// Checkpoints read per screen, most recently written first (each read
    /// is one storage request; older ones are counted, not read).
    #[arg(long, default_value_t = 200)]
    max_reads: usize,
}

#[derive(Debug, Serialize)]
struct QueueStatus {
    name: String,
    /// Messages in the queue, visible or not (the service's estimate).
    approximate_depth: u64,
    /// How long the oldest visible message has been waiting.
    oldest_visible_age_seconds: Option<i64>,
}

#[derive(Debug, Serialize)]
struct JobStatus {
    job: String,
    progress: serde_json::Value,
    last_write_seconds_ago: Option<i64>,
}

#[derive(Debug, Serialize)]
struct WorkerStatus {
    url: String,
    ready: bool,
    /// The HTTP status, or why there was none.
    detail: String,
}

#[derive(Debug, Serialize)]
struct Status {
    at: String,
    queue: QueueStatus,
    poison: QueueStatus,
    /// The regular lane's queue, with lanes (both lanes poison into the
    /// one poison queue above).
    #[serde(skip_serializing_if = "Option::is_none")]
    regular: Option<QueueStatus>,
    jobs_in_progress: Vec<JobStatus>,
    /// Jobs whose handler failed and that will be tried again, by job
    /// key, with the latest failure (their messages' attempt records).
    failing: FailingJobs,
    /// Jobs whose checkpoint keeps not being saved for a reason that may
    /// clear (the store unavailable, credentials refused, a directory
    /// that never holds still), by job key (the runner's save-trouble
    /// records).
    save_trouble: SaveTroubles,
    completed_jobs: usize,
    /// Job checkpoints beyond --max-reads, not read.
    checkpoints_not_read: usize,
    /// Where the finished jobs' time went (docs/goodput.md).
    goodput: FleetGoodput,
    /// What the fleet's VMs (pods) were paid for, by lane: the workers'
    /// lifetime records (docs/deploying.md, "How to read the bill").
    bill: BillStatus,
    workers: Vec<WorkerStatus>,
    /// The checkpoint interval and the estimates behind it.
    checkpoint_interval: IntervalStatus,
    /// With lanes: d, the jobs with a deadline not finished yet, and the
    /// finished jobs' hours and money by lane.
    #[serde(skip_serializing_if = "Option::is_none")]
    lanes: Option<LanesStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lane_accounting: Option<LaneAccounting>,
    /// Per queue whose fleet counts are in the checkpoint container: the
    /// share of notices that saved, and the work lost per interruption.
    notices: Vec<QueueNotices>,
}

pub async fn run(args: StatusArgs) -> Result<()> {
    let fleet = Fleet::from_env()?;
    let health: Vec<String> = args
        .health
        .iter()
        .map(|url| readiness_url(url))
        .collect::<Result<_>>()?;
    let http = reqwest::Client::builder()
        .timeout(HEALTH_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        // Workers are reached directly on their private addresses.
        .no_proxy()
        .build()
        .context("building the HTTP client")?;
    let interrupted = spot_worker_runtime::interrupted();
    tokio::pin!(interrupted);
    for screen in 1u64.. {
        let status = gather(&fleet, &http, &health, args.max_reads).await?;
        print(&status, args.json, args.watch)?;
        if !args.watch || args.count.is_some_and(|count| screen >= count) {
            break;
        }
        tokio::select! {
            _ = &mut interrupted => break,
            () = tokio::time::sleep(args.interval) => {}
        }
    }
    Ok(())
}

/// The readiness URL for what was given: `/readyz` when there is no path.
fn readiness_url(given: &str) -> Result<String> {
    let mut url = reqwest::Url::parse(given)
        .with_context(|| format!("--health {given:?} is not a URL (e.g. http://10.0.0.4:8080)"))?;
    if !matches!(url.scheme(), "http" | "https") {
        bail!("--health {given:?}: only http and https URLs are supported");
    }
    if url.path() == "/" {
        url.set_path("/readyz");
    }
    Ok(url.to_string())
}

async fn gather(
    fleet: &Fleet,
    http: &reqwest::Client,
    health: &[String],
    max_reads: usize,
) -> Result<Status> {
    let queue = queue_status(&fleet.queue()?).await?;
    let poison = queue_status(&fleet.poison_queue()?).await?;
    let checkpoints = fleet.checkpoints()?;
    let (rows, checkpoints_not_read) = job_rows(&checkpoints, Some(max_reads)).await?;
    let failing = failing_jobs(&checkpoints, max_reads).await?;
    let save_trouble = save_troubles(&checkpoints, max_reads).await?;
    let notices = notices_by_queue(&checkpoints).await?;
    let checkpoint_interval = interval_status(Arc::new(checkpoints), &fleet.config).await?;
    let completed_jobs = rows
        .iter()
        .filter(|row| matches!(row.checkpoint, Ok(ref c) if c.is_completed()))
        .count();
    let jobs_in_progress = rows
        .into_iter()
        .filter(JobRow::is_in_progress)
        .map(|row| JobStatus {
            progress: match row.checkpoint {
                Ok(spot_worker_storage::Checkpoint::InProgress { progress }) => progress,
                _ => serde_json::Value::Null,
            },
            last_write_seconds_ago: row.last_write.map(seconds_since),
            job: row.job,
        })
        .collect();
    let (records, records_not_read) = read_records(&fleet.checkpoints()?, max_reads).await?;
    let settings = spot_worker::settings::Source::from_env().context("reading the settings")?;
    let price = settings
        .get(&spot_worker::settings::table::PRICE_PER_HOUR)
        .context("reading SPOT_WORKER_PRICE_PER_HOUR")?
        .map(|text| parse_price(&text))
        .transpose()?;
    let regular_price = settings
        .get(&spot_worker::settings::table::REGULAR_PRICE_PER_HOUR)
        .context("reading SPOT_WORKER_REGULAR_PRICE_PER_HOUR")?
        .map(|text| parse_price(&text))
        .transpose()?;
    let (slots, lease) = (fleet.config.concurrency, fleet.config.visibility_timeout);
    // A job's regular time is charged at the regular price.
    let pricing = price.map(|price| {
        move |ledger: &_| {
            job_cost(
                ledger,
                blended_price(ledger, price, regular_price),
                slots,
                lease,
            )
        }
    });
    let ledgers: Vec<_> = records
        .iter()
        .map(|record| record.as_ref().map(|record| record.goodput))
        .collect();
    let goodput = sum_up(
        &ledgers,
        records_not_read,
        pricing.as_ref().map(|f| f as &dyn Fn(&_) -> _),
    );
    let bill = read_bill(&fleet.checkpoints()?, max_reads, price, regular_price).await?;
    let (regular, lanes, lane_accounting) = match &fleet.config.lanes.regular_queue {
        Some(name) => {
            let regular_queue = fleet.queue_named(name)?;
            let queues = queue_status(&regular_queue).await?;
            let lanes = lanes_status(
                &fleet.checkpoints()?,
                &fleet.config.lanes,
                [
                    (&fleet.queue()?, spot_worker_decisions::lanes::Lane::Spot),
                    (&regular_queue, spot_worker_decisions::lanes::Lane::Regular),
                ],
                fleet.config.encoding,
                settings
                    .get(&spot_worker::settings::table::JOB_KEY)
                    .context("reading SPOT_WORKER_JOB_KEY")?
                    .as_deref(),
                max_reads,
            )
            .await?;
            let accounting = lane_accounting(&records, price, regular_price, slots);
            (Some(queues), Some(lanes), Some(accounting))
        }
        None => (None, None, None),
    };
    let mut workers = Vec::with_capacity(health.len());
    for url in health {
        workers.push(worker_status(http, url).await);
    }
    Ok(Status {
        at: rfc3339(OffsetDateTime::now_utc()),
        queue,
        poison,
        jobs_in_progress,
        failing,
        save_trouble,
        completed_jobs,
        checkpoints_not_read,
        goodput,
        bill,
        workers,
        checkpoint_interval,
        regular,
        lanes,
        lane_accounting,
        notices,
    })
}

async fn queue_status(queue: &AzureQueue) -> Result<QueueStatus> {
    let name = spot_worker_storage::MessageQueue::name(queue).to_owned();
    let depth = match queue.approximate_message_count().await {
        Ok(depth) => depth,
        // Not created yet: empty.
        Err(StorageError::NotFound { .. }) => 0,
        Err(e) => return Err(e).with_context(|| format!("reading the depth of queue {name}")),
    };
    let oldest = if depth == 0 {
        None
    } else {
        queue
            .peek(1)
            .await
            .with_context(|| format!("peeking at queue {name}"))?
            .first()
            .and_then(|message| message.inserted_at)
            .map(seconds_since)
    };
    Ok(QueueStatus {
        name,
        approximate_depth: depth,
        oldest_visible_age_seconds: oldest,
    })
}

async fn worker_status(http: &reqwest::Client, url: &str) -> WorkerStatus {
    let (ready, detail) = match http.get(url).send().await {
        Ok(response) => (
            response.status() == reqwest::StatusCode::OK,
            response.status().to_string(),
        ),
        Err(e) if e.is_timeout() => (false, "no answer in time".to_owned()),
        Err(e) if e.is_connect() => (false, "unreachable".to_owned()),
        Err(e) => (false, format!("{e}")),
    };
    WorkerStatus {
        url: url.to_owned(),
        ready,
        detail,
    }
}

fn print(status: &Status, json: bool, watch: bool) -> Result<()> {
    if json {
        let text = if watch {
            serde_json::to_string(status)?
        } else {
            serde_json::to_string_pretty(status)?
        };
        println!("{text}");
        return Ok(());
    }
    if watch && std::io::stdout().is_terminal() {
        // Clear the terminal between screens, as `watch` does.
        print!("\x1b[2J\x1b[H");
    }
    println!("{}", status.at);
    let mut queues = vec![("queue", &status.queue), ("poison", &status.poison)];
    if let Some(regular) = &status.regular {
        queues.push(("regular", regular));
    }
    for (label, queue) in queues {
        let oldest = queue
            .oldest_visible_age_seconds
            .map_or_else(|| "-".to_owned(), age);
        println!(
            "{label:<7} {:<32} ~{} message(s), oldest visible waiting {oldest}",
            queue.name, queue.approximate_depth
        );
    }
    let unread = match status.checkpoints_not_read {
        0 => String::new(),
        n => format!("; {n} older not read, see --max-reads"),
    };
    println!(
        "jobs    {} in progress, {} completed (checkpoints{unread})",
        status.jobs_in_progress.len(),
        status.completed_jobs
    );
    for job in &status.jobs_in_progress {
        let last = ago(job
            .last_write_seconds_ago
            .map(|s| OffsetDateTime::now_utc() - time::Duration::seconds(s)));
        println!(
            "  {:<32} {:<40} last write {last}",
            job.job,
            saved_files::one_line(&job.progress, 40)
        );
    }
    for line in failing::lines(&status.failing) {
        println!("{line}");
    }
    for line in save_trouble::lines(&status.save_trouble) {
        println!("{line}");
    }
    print_goodput(&status.goodput);
    for line in bill::lines(&status.bill) {
        println!("{line}");
    }
    if let Some(accounting) = &status.lane_accounting {
        println!("{}", accounting_line(accounting));
    }
    if let Some(lanes) = &status.lanes {
        for line in lanes::lines(lanes) {
            println!("{line}");
        }
    }
    for line in interval::lines(&status.checkpoint_interval) {
        println!("{line}");
    }
    if !status.notices.is_empty() {
        println!("notices per queue (the checkpoint container's fleet counts):");
        for queue in &status.notices {
            println!("{}", queue.line());
        }
    }
    for worker in &status.workers {
        let state = if worker.ready { "ready" } else { "NOT READY" };
        println!("worker  {:<40} {state} ({})", worker.url, worker.detail);
    }
    Ok(())
}

/// The finished jobs' hours and money by lane, and their deadlines.
fn accounting_line(sum: &LaneAccounting) -> String {
    let money = |cost: Option<f64>| cost.map_or_else(String::new, |c| format!(" (${c:.4})"));
    format!(
        "  by lane: Spot {:.2} h{}, regular {:.2} h{}; deadlines {} met, {} missed ({} move(s) between lanes)",
        sum.spot_hours,
        money(sum.spot_cost),
        sum.regular_hours,
        money(sum.regular_cost),
        sum.deadlines_met,
        sum.deadlines_missed,
        sum.moves
    )
}

/// The goodput lines: seconds by kind and the share of each, and money
/// when priced.
fn print_goodput(goodput: &FleetGoodput) {
    let unread = match (goodput.not_read, goodput.unreadable) {
        (0, 0) => String::new(),
        (n, 0) => format!("; {n} older not read, see --max-reads"),
        (n, bad) => format!("; {n} older not read, {bad} unreadable"),
    };
    let Some(share) = goodput.goodput else {
        println!(
            "goodput no finished job recorded yet ({} completion record(s){unread})",
            goodput.jobs
        );
        return;
    };
    println!(
        "goodput {:.1} % useful over {} finished job(s) (completion records{unread})",
        share * 100.0,
        goodput.jobs
    );
    let total = goodput.useful_seconds
        + goodput.redone_seconds
        + goodput.checkpointing_seconds
        + goodput.waiting_seconds;
    let costs = goodput
        .cost
        .map(|c| [c.useful, c.redone, c.checkpointing, c.waiting]);
    for (i, (kind, seconds)) in [
        ("useful", goodput.useful_seconds),
        ("redone", goodput.redone_seconds),
        ("checkpointing", goodput.checkpointing_seconds),
        ("waiting", goodput.waiting_seconds),
    ]
    .into_iter()
    .enumerate()
    {
        let money = costs.map_or_else(String::new, |c| format!("  ${:.4}", c[i]));
        println!(
            "  {kind:<14} {seconds:>12.1} s {:>6.1} %{money}",
            seconds * 100.0 / total
        );
    }
    if let Some(cost) = goodput.cost {
        println!(
            "  {:<14} {:>12.1} s          ${:.4}",
            "total", total, cost.total
        );
    }
    if goodput.unaccounted_deliveries > 0 {
        println!(
            "  {} delivery(ies) cut before their first checkpoint left no accounting: their time is missing above",
            goodput.unaccounted_deliveries
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_urls_default_to_readyz() {
        for (given, expected) in [
            ("http://10.0.0.4:8080", "http://10.0.0.4:8080/readyz"),
            ("http://10.0.0.4:8080/", "http://10.0.0.4:8080/readyz"),
            (
                "http://10.0.0.4:8080/healthz",
                "http://10.0.0.4:8080/healthz",
            ),
        ] {
            assert_eq!(readiness_url(given).unwrap(), expected);
        }
        assert!(readiness_url("10.0.0.4:8080").is_err());
        assert!(readiness_url("ftp://x/").is_err());
    }
}
