//! Storage requests per job, by kind: what each loop of the throughput
//! benchmark asked of the queue and the checkpoint store (as the testkit's
//! `FaultyQueue` and `CountingStore` record them), set against the fewest
//! the protocol allows. Azure bills every one of them as a
//! transaction, and on Azurite they are also what the CPU goes to.

use std::time::Duration;

use spot_worker_testkit::counting::StoreCalls;
use spot_worker_testkit::faulty::QueueFaults;

use crate::rounds::{Drained, Loop, Rounds};
use crate::{BATCH, Options};

/// Dollars per 10,000 operations of each kind.
pub struct Prices {
    /// Get Messages.
    pub queue_class_2: f64,
    /// Delete Message, Update Message, Put Message, Create Queue.
    pub queue_class_1: f64,
    /// Get Blob.
    pub blob_read: f64,
    /// Put Blob (and Create Container, billed alike).
    pub blob_write: f64,
    /// Delete Blob.
    pub blob_delete: f64,
}

/// Standard general-purpose v2, LRS, East US, hot tier, as docs/benchmarks.md
/// sources them (Azure Retail Prices figures recorded 2026-09-24; the
/// categories from Microsoft's "Map each REST operation to a price").
pub const PRICES: Prices = Prices {
    queue_class_2: 0.004,
    queue_class_1: 0.004,
    blob_read: 0.004,
    blob_write: 0.05,
    blob_delete: 0.0,
};

/// Requests of one run, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Requests {
    pub receive: f64,
    pub delete: f64,
    /// Visibility updates: renewals, releases and retries.
    pub update: f64,
    pub blob_read: f64,
    /// Checkpoint writes that update an existing blob (`If-Match`).
    pub blob_write: f64,
    /// Checkpoint writes that create the blob (`If-None-Match: *`), and
    /// queue or container creation when a worker prepares its storage.
    pub create: f64,
    pub blob_delete: f64,
}

impl Requests {
    pub fn total(&self) -> f64 {
        self.receive
            + self.delete
            + self.update
            + self.blob_read
            + self.blob_write
            + self.create
            + self.blob_delete
    }

    /// Per job, over `jobs` jobs.
    pub fn per(&self, jobs: u64) -> Requests {
        let n = jobs.max(1) as f64;
        Requests {
            receive: self.receive / n,
            delete: self.delete / n,
            update: self.update / n,
            blob_read: self.blob_read / n,
            blob_write: self.blob_write / n,
            create: self.create / n,
            blob_delete: self.blob_delete / n,
        }
    }

    /// The fewest requests a job can cost: its share of a receive of
    /// `batch`, its delete, a visibility update for each further lease
    /// period it runs (`renewals`), and its checkpoint: one write that
    /// creates the blob. A job keyed by its message id needs no read on its
    /// first delivery (nobody can have written under the id of a message
    /// nobody received); one keyed by its body would add the completed
    /// check's read.
    pub fn minimum(batch: u8, checkpoint: bool, renewals: u64) -> Requests {
        Requests {
            receive: 1.0 / f64::from(batch),
            delete: 1.0,
            update: renewals as f64,
            create: if checkpoint { 1.0 } else { 0.0 },
            ..Requests::default()
        }
    }

    /// One table row.
    pub fn row(&self, label: &str) -> String {
        format!(
            "| {label} | {:.3} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | **{:.2}** | ${:.2} |",
            self.receive,
            self.delete,
            self.update,
            self.blob_read,
            self.blob_write,
            self.create,
            self.blob_delete,
            self.total(),
            self.dollars_per_million()
        )
    }

    /// What a million jobs cost at [`PRICES`].
    pub fn dollars_per_million(&self) -> f64 {
        let p = PRICES;
        let per_job = self.receive * p.queue_class_2
            + (self.delete + self.update) * p.queue_class_1
            + self.blob_read * p.blob_read
            + (self.blob_write + self.create) * p.blob_write
            + self.blob_delete * p.blob_delete;
        per_job * 1e6 / 10_000.0
    }

    /// Everything a run asked of its queue and (if any) checkpoint store.
    pub fn of(queue: &QueueFaults, store: Option<&StoreCalls>) -> Requests {
        let (receives, updates, deletes, _) = queue.calls();
        let mut requests = Requests {
            receive: receives as f64,
            delete: f64::from(deletes),
            update: f64::from(updates),
            create: f64::from(queue.prepares()),
            ..Requests::default()
        };
        if let Some(store) = store {
            requests.blob_read = store.reads() as f64;
            requests.blob_write = store.updates() as f64;
            requests.create += store.creates() as f64;
            requests.blob_delete = store.deletes() as f64;
        }
        requests
    }

    pub const HEADER: &'static str = "| loop | receive | delete | update/renew | blob read | blob write | create | blob delete | total | $ per 10⁶ jobs |\n|---|---|---|---|---|---|---|---|---|---|";
}

/// Requests per job by kind, each loop's median run, against the minimum.
pub fn print_requests(rounds: &Rounds, long: &Drained, options: &Options) {
    let per_job = |which: Loop| -> Option<Requests> {
        let mut runs: Vec<&Drained> = rounds.iter().filter_map(|r| r.get(&which)).collect();
        runs.sort_by(|a, b| a.requests.total().total_cmp(&b.requests.total()));
        let median = runs.get(runs.len() / 2)?;
        Some(median.requests.per(median.messages))
    };
    // A lease must be renewed once for each further period the job runs.
    let renewals = |job: Duration, lease: Duration| {
        ((job.as_secs_f64() / lease.as_secs_f64()).ceil() as u64).saturating_sub(1)
    };
    println!(
        "## Storage requests per job (median run; `create` = checkpoint creates and queue/container creation)
"
    );
    println!("{}", Requests::HEADER);
    let rows = [
        (Loop::SpotWorker, "spot-worker, trivial handler"),
        (Loop::RawRust, "raw Rust SDK loop, trivial"),
        (Loop::PythonThreads, "Python SDK loop (threads), trivial"),
        (
            Loop::PythonSequential,
            "Python SDK loop (sequential), trivial",
        ),
    ];
    for (which, label) in rows {
        if let Some(requests) = per_job(which) {
            println!("{}", requests.row(label));
        }
    }
    println!(
        "{}",
        Requests::minimum(BATCH, false, 0).row("protocol minimum, trivial")
    );
    if let Some(requests) = per_job(Loop::SpotWorkerCheckpoints) {
        println!(
            "{}",
            requests.row("spot-worker, one checkpoint write per job")
        );
    }
    println!(
        "{}",
        Requests::minimum(BATCH, true, 0).row("protocol minimum, one checkpoint write")
    );
    let long_label = format!(
        "spot-worker, {} jobs of {:?} under a {:?} lease",
        options.long_jobs, options.long_job, options.long_visibility
    );
    println!("{}", long.requests.per(long.messages).row(&long_label));
    let minimum = Requests::minimum(
        BATCH,
        false,
        renewals(options.long_job, options.long_visibility),
    );
    // The long jobs all fit into one receive, not a 32nd of one each.
    let minimum = Requests {
        receive: 1.0 / options.long_jobs as f64,
        ..minimum
    };
    println!("{}", minimum.row("protocol minimum, same long jobs"));
    println!();
}
