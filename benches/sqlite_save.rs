//! What saving a live SQLite database costs: the database in a
//! checkpoint directory, written continuously by a program's connection
//! (a commit every 2 ms, or every `--commit-every MS`, each adding a row
//! of 1 KiB, as a study or a log of work done grows), saved the way
//! `spot-worker run` saves it — SQLite's online backup into a copy
//! (`with_consistent_databases`), then the copy chunked and sent
//! (`JobCheckpoint::save_files`) — over and over.
//!
//! `cargo bench --bench sqlite_save [-- --saves N] [-- --gigabyte] [-- --commit-every MS]`
//! (`cargo test --bench sqlite_save -- --bench`: the same on the debug
//! build). Under `cargo test --all-targets` it runs a smoke version.
//!
//! For 10 MB and 100 MB (and 1 GB with `--gigabyte`), in rollback-journal
//! and WAL mode, it reports:
//! - the save's median time, and its throughput (database bytes a second);
//! - the median bytes sent per save after the first (chunks reused);
//! - how long the program's commits took: median and max with no save
//!   running (the baseline, measured in the same run), and while saves ran;
//! - the peak resident memory of the process while saving (the writer's
//!   connection included; the chunks sent are dropped, not kept).
//!
//! Real files on the machine's temporary directory, real SQLite; the store
//! the chunks go to drops them (what a network costs is not measured here).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use bytes::Bytes;
use rusqlite::Connection;
use spot_worker::storage::files::{CheckpointFiles, ChunkStore};
use spot_worker::storage::{
    Checkpoint, CheckpointStore, ETag, InMemoryCheckpointStore, JobCheckpoint, StorageError,
    StoredCheckpoint, WritePrecondition, async_trait,
};
use spot_worker_command::with_consistent_databases;
use spot_worker_testkit::bench::{self, BenchArgs, median};

const MB: u64 = 1_000_000;
const ROW: usize = 4096;
/// The size of a row the writer adds.
const ADDED: usize = 1024;

fn main() -> Result<()> {
    let args = BenchArgs::from_env();
    let mut every = Duration::from_millis(2);
    let (mut saves, mut sizes) = if args.benchmarking() {
        (5, vec![10 * MB, 100 * MB])
    } else {
        (2, vec![2 * MB])
    };
    args.each_flag(|flag, value| {
        if flag == "--saves" {
            saves = value.parse()?;
        }
        if flag == "--commit-every" {
            every = Duration::from_millis(value.parse()?);
        }
        Ok(())
    })?;
    if args.has("--gigabyte") {
        sizes.push(1000 * MB);
    }
    ensure!(
        saves >= 2,
        "--saves: at least 2 (the first sends everything)"
    );
    println!(
        "live SQLite database save benchmark on {}, a commit every {} ms",
        bench::machine(),
        every.as_millis()
    );
    println!(
        "| database | mode | save, median | throughput | sent per save (after the first) | commit median / max, no save | commit median / max, saving | peak RSS |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let runtime = bench::runtime()?;
    for size in sizes {
        for mode in ["delete", "wal"] {
            case(&runtime, size, mode, saves, every)?;
        }
    }
    Ok(())
}

/// One database of `size` bytes in journal mode `mode`, saved `saves`
/// times while written.
fn case(
    runtime: &tokio::runtime::Runtime,
    size: u64,
    mode: &str,
    saves: usize,
    every: Duration,
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let scratch = tempfile::tempdir()?;
    let db = dir.path().join("state.db");
    fill(&db, mode, size)?;
    let baseline = writing(&db, every, || {
        std::thread::sleep(Duration::from_secs(2));
        Ok(())
    })?;

    let store = Arc::new(Dropping(InMemoryCheckpointStore::new()));
    let mut checkpoint = runtime.block_on(JobCheckpoint::load(store.clone(), "bench"))?;
    let roots = CheckpointFiles::dir(dir.path());
    let mut took = Vec::new();
    let mut sent = Vec::new();
    clear_peak_rss();
    let during = writing(&db, every, || {
        for _ in 0..saves {
            let started = Instant::now();
            let (with, copies) = with_consistent_databases(&roots, scratch.path())?;
            let stats = runtime.block_on(checkpoint.save_files(&with))?;
            took.push(started.elapsed());
            sent.push(stats.sent_bytes);
            drop(copies);
        }
        Ok(())
    })?;
    let peak = peak_rss_kb()?;
    let save = median(&took);
    let mut later = sent[1..].to_vec();
    later.sort_unstable();
    let sent_median = later[later.len() / 2];
    let (base_median, base_max) = latencies(&baseline);
    let (save_median, save_max) = latencies(&during);
    println!(
        "| {} MB | {} | {:.0} ms | {:.0} MB/s | {:.2} MB | {:.2} / {:.1} ms | {:.2} / {:.1} ms | {} MB |",
        size / MB,
        if mode == "wal" {
            "WAL"
        } else {
            "rollback journal"
        },
        save.as_secs_f64() * 1e3,
        size as f64 / save.as_secs_f64() / 1e6,
        sent_median as f64 / 1e6,
        base_median.as_secs_f64() * 1e3,
        base_max.as_secs_f64() * 1e3,
        save_median.as_secs_f64() * 1e3,
        save_max.as_secs_f64() * 1e3,
        peak / 1000,
    );
    Ok(())
}

/// Makes the database: `size` bytes of rows of [`ROW`] bytes.
fn fill(db: &Path, mode: &str, size: u64) -> Result<()> {
    let connection = Connection::open(db)?;
    connection.pragma_update(None, "journal_mode", mode)?;
    connection.execute_batch("CREATE TABLE t (n INTEGER PRIMARY KEY, pad BLOB)")?;
    let rows = size / ROW as u64;
    connection.execute_batch("BEGIN")?;
    {
        let mut insert = connection.prepare("INSERT INTO t VALUES (?1, randomblob(?2))")?;
        for n in 0..rows {
            insert.execute((n, ROW as i64))?;
        }
    }
    connection.execute_batch("COMMIT")?;
    Ok(())
}

/// Runs `meanwhile` while a connection of its own adds a row of 1 KiB
/// every `every`, each its own commit; each commit's time.
fn writing(
    db: &Path,
    every: Duration,
    meanwhile: impl FnOnce() -> Result<()>,
) -> Result<Vec<Duration>> {
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (db, stop) = (db.to_owned(), Arc::clone(&stop));
        std::thread::spawn(move || -> Result<Vec<Duration>> {
            let connection = Connection::open(db)?;
            connection.busy_timeout(Duration::from_secs(60))?;
            let mut times = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                connection.execute(
                    "INSERT INTO t (pad) VALUES (randomblob(?1))",
                    (ADDED as i64,),
                )?;
                times.push(started.elapsed());
                std::thread::sleep(every);
            }
            Ok(times)
        })
    };
    let done = meanwhile();
    stop.store(true, Ordering::Relaxed);
    let times = writer
        .join()
        .map_err(|_| anyhow::anyhow!("the writer panicked"))??;
    done?;
    Ok(times)
}

fn latencies(times: &[Duration]) -> (Duration, Duration) {
    (
        median(times),
        times.iter().copied().max().unwrap_or_default(),
    )
}

/// Resets the process's peak resident set (`VmHWM`) to what it holds now.
fn clear_peak_rss() {
    // Linux 4.0 and later; an older kernel reports the peak since start.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn peak_rss_kb() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|line| line.starts_with("VmHWM:"))
        .ok_or_else(|| anyhow::anyhow!("no VmHWM in /proc/self/status"))?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .unwrap_or("0")
        .parse::<u64>()?
        * 1024
        / 1000)
}

/// An in-memory checkpoint store whose chunks are dropped as they come:
/// a save's cost, not a store's memory.
struct Dropping(InMemoryCheckpointStore);

struct NoChunks;

#[async_trait]
impl ChunkStore for NoChunks {
    async fn put(&self, _name: &str, _chunk: Bytes) -> Result<(), StorageError> {
        Ok(())
    }

    async fn get(&self, _name: &str, _len: usize) -> Result<Option<Bytes>, StorageError> {
        Ok(None)
    }

    async fn touch(&self, _name: &str) -> Result<bool, StorageError> {
        Ok(true)
    }

    async fn delete(&self, _name: &str) -> Result<(), StorageError> {
        Ok(())
    }
}

#[async_trait]
impl CheckpointStore for Dropping {
    async fn prepare(&self) -> Result<(), StorageError> {
        self.0.prepare().await
    }

    async fn read(&self, key: &str) -> Result<Option<StoredCheckpoint>, StorageError> {
        self.0.read(key).await
    }

    async fn write(
        &self,
        key: &str,
        checkpoint: &Checkpoint,
        precondition: WritePrecondition,
        stamp: Option<&str>,
    ) -> Result<ETag, StorageError> {
        self.0.write(key, checkpoint, precondition, stamp).await
    }

    async fn delete(&self, key: &str) -> Result<(), StorageError> {
        self.0.delete(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        self.0.list(prefix).await
    }

    fn chunks(&self) -> Option<Arc<dyn ChunkStore>> {
        Some(Arc::new(NoChunks))
    }
}
