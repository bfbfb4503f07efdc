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
//! - the runner's peak resident memory while saving, and what it held just
//!   before: the bench's process is the runner alone, since the program
//!   (the database's making and its writer) is a process of its own, this
//!   binary run again with `--fill` or `--write`, as `spot-worker run`'s
//!   program is; the chunks sent are dropped, not kept.
//!
//! Real files on the machine's temporary directory, real SQLite; the store
//! the chunks go to drops them (what a network costs is not measured here).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use bytes::Bytes;
use rusqlite::Connection;
use spot_worker::storage::files::{CheckpointFiles, ChunkStore};
use spot_worker::storage::{
    Checkpoint, CheckpointStore, ETag, InMemoryCheckpointStore, JobCheckpoint, StorageError,
    StoredCheckpoint, WritePrecondition, async_trait,
};
use spot_worker_command::with_consistent_databases;
use spot_worker_testkit::bench::{self, BenchArgs, median};
use spot_worker_testkit::procfs::{self, Process};

const MB: u64 = 1_000_000;
const ROW: usize = 4096;
/// The size of a row the writer adds.
const ADDED: usize = 1024;
/// Child mode: make the database (`--fill DB MODE BYTES`).
const FILL: &str = "--fill";
/// Child mode: the program writing it (`--write DB MICROSECONDS`), until
/// its stdin closes.
const WRITE: &str = "--write";
/// The longest a writer child writes if its parent never closes its stdin.
const WRITING_AT_MOST: Duration = Duration::from_secs(3600);

fn main() -> Result<()> {
    let args = BenchArgs::from_env();
    if let Some(child) = args.after(FILL) {
        return fill_mode(child);
    }
    if let Some(child) = args.after(WRITE) {
        return write_mode(child);
    }
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
        "| database | mode | save, median | throughput | sent per save (after the first) | commit median / max, no save | commit median / max, saving | runner's peak RSS (before the saves) |"
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
    let before = procfs::rss_kib(Process::This)?;
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
    let peak = procfs::peak_rss_kib(Process::This)?;
    let save = median(&took);
    let mut later = sent[1..].to_vec();
    later.sort_unstable();
    let sent_median = later[later.len() / 2];
    let (base_median, base_max) = latencies(&baseline);
    let (save_median, save_max) = latencies(&during);
    println!(
        "| {} MB | {} | {:.0} ms | {:.0} MB/s | {:.2} MB | {:.2} / {:.1} ms | {:.2} / {:.1} ms | {} MB ({} MB) |",
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
        peak * 1024 / 1_000_000,
        before * 1024 / 1_000_000,
    );
    Ok(())
}

/// Makes the database: `size` bytes of rows of [`ROW`] bytes, in a child
/// process (so that what SQLite and the allocator keep of it is not counted
/// as the runner's memory).
fn fill(db: &Path, mode: &str, size: u64) -> Result<()> {
    let status = Command::new(std::env::current_exe()?)
        .arg(FILL)
        .arg(db)
        .arg(mode)
        .arg(size.to_string())
        .stdin(Stdio::null())
        .status()
        .context("making the database in a child process")?;
    ensure!(status.success(), "making the database: the child {status}");
    Ok(())
}

/// Child mode `--fill DB MODE BYTES`.
fn fill_mode(args: &[String]) -> Result<()> {
    let [db, mode, size] = args else {
        bail!("{FILL} DB MODE BYTES, not {args:?}");
    };
    let size: u64 = size.parse().with_context(|| format!("{FILL}: {size}"))?;
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

/// Runs `meanwhile` while the program, a child process, adds a row of
/// 1 KiB every `every` through a connection of its own, each its own
/// commit; each commit's time.
fn writing(
    db: &Path,
    every: Duration,
    meanwhile: impl FnOnce() -> Result<()>,
) -> Result<Vec<Duration>> {
    let mut child = Command::new(std::env::current_exe()?)
        .arg(WRITE)
        .arg(db)
        .arg(every.as_micros().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the writer process")?;
    let stdin = child.stdin.take().context("the writer's stdin")?;
    let mut stdout = BufReader::new(child.stdout.take().context("the writer's stdout")?);
    let mut ready = String::new();
    stdout.read_line(&mut ready)?;
    // Whatever `meanwhile` comes to, the writer is stopped (its stdin
    // closed) and waited for.
    let done = if ready.trim() == "ready" {
        meanwhile()
    } else {
        Err(anyhow::anyhow!("the writer did not start: {ready:?}"))
    };
    drop(stdin);
    let mut times = Vec::new();
    for line in stdout.lines() {
        let nanos: u64 = line?.trim().parse().context("a commit time")?;
        times.push(Duration::from_nanos(nanos));
    }
    let status = child.wait()?;
    done?;
    ensure!(status.success(), "the writer: {status}");
    Ok(times)
}

/// Child mode `--write DB MICROSECONDS`: says `ready` once its connection
/// is open, commits a row every MICROSECONDS until its stdin closes (or for
/// [`WRITING_AT_MOST`]), then prints each commit's time in nanoseconds.
fn write_mode(args: &[String]) -> Result<()> {
    let [db, every] = args else {
        bail!("{WRITE} DB MICROSECONDS, not {args:?}");
    };
    let every = Duration::from_micros(every.parse().with_context(|| format!("{WRITE}: {every}"))?);
    let connection = Connection::open(db)?;
    connection.busy_timeout(Duration::from_secs(60))?;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            stop.store(true, Ordering::Relaxed);
        });
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready")?;
    out.flush()?;
    let until = Instant::now() + WRITING_AT_MOST;
    let mut times = Vec::new();
    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
        let started = Instant::now();
        connection.execute(
            "INSERT INTO t (pad) VALUES (randomblob(?1))",
            (ADDED as i64,),
        )?;
        times.push(started.elapsed());
        std::thread::sleep(every);
    }
    for time in times {
        writeln!(out, "{}", time.as_nanos())?;
    }
    out.flush()?;
    Ok(())
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
