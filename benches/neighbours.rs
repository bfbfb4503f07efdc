//! What the runner's guards against its neighbours cost (issue 30).
//!
//! `cargo bench --bench neighbours [-- --rounds N]`
//!
//! Under `cargo test --all-targets` (no `--bench` flag) it runs a smoke
//! version (a few rounds) so it cannot rot unnoticed. Real files on the
//! machine's temporary file system, medians of `--rounds` rounds, each
//! figure set against a baseline measured in the same run.
//!
//! 1. **A rendezvous look**, what a worker holding an approval does every
//!    200 ms: list its group directory of 8 peers, and for each open the
//!    member file, try its lock (held, as a live peer's is) and read its
//!    text. Baseline: the look before issue 30 (`File::open`,
//!    `read_to_string`). Hardened: `spot_worker_untrusted::open`
//!    (`O_NOFOLLOW | O_NONBLOCK`, type and owner checked on the open file)
//!    and at most 256 bytes read; and the same from a Tokio runtime on a
//!    blocking thread under a timeout, as the worker does.
//! 2. **The start-up sweep** over a work root of 200 delivery directories
//!    of other runners (their runner files of the earlier layout): what
//!    `sweep_leftovers` adds per directory (it opens each runner file as
//!    someone else's and leaves the directory alone). Baseline: listing the
//!    work root alone.

use std::fs::File;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use spot_worker_testkit::bench::{self, BenchArgs, median, percentile};
use spot_worker_untrusted::{Owners, read_at_most};

/// Peers in the rendezvous look.
const PEERS: usize = 8;
/// Delivery directories in the swept work root.
const DIRECTORIES: usize = 200;

fn main() -> Result<()> {
    let args = BenchArgs::from_env();
    let mut rounds = if args.benchmarking() { 2000 } else { 20 };
    args.each_flag(|flag, value| {
        if flag == "--rounds" {
            rounds = value.parse()?;
        }
        Ok(())
    })?;
    ensure!(rounds >= 1);
    println!("neighbours benchmark on {}", bench::machine());
    rendezvous_look(rounds)?;
    sweep(rounds.min(200))?;
    Ok(())
}

fn rendezvous_look(rounds: usize) -> Result<()> {
    let group = tempfile::tempdir()?;
    // Live peers: each member file locked by a handle kept open.
    let mut held = Vec::new();
    for peer in 0..PEERS {
        let path = group.path().join(format!("{peer}-0000abcd.working"));
        std::fs::write(&path, format!("pid {peer}, queue jobs-{peer}"))?;
        let file = File::open(&path)?;
        file.lock()?;
        held.push(file);
    }
    let baseline = measure(rounds, || {
        look(group.path(), |path| {
            let file = File::open(path)?;
            let _ = file.try_lock_shared();
            Ok(std::io::read_to_string(&file)?.len())
        })
    })?;
    let owners = Owners::Only(vec![
        // SAFETY: geteuid has no arguments and cannot fail.
        unsafe { libc::geteuid() },
        0,
    ]);
    let hardened = measure(rounds, || {
        look(group.path(), |path| {
            let mut file = spot_worker_untrusted::open(path, &owners)?;
            let _ = file.try_lock_shared();
            Ok(read_at_most(&mut file, 256)?.0.len())
        })
    })?;
    let runtime = bench::runtime()?;
    let dir = group.path().to_owned();
    let off_runtime = runtime.block_on(async {
        let mut times = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let (dir, owners) = (dir.clone(), owners.clone());
            let started = Instant::now();
            let reading = tokio::task::spawn_blocking(move || {
                look(&dir, |path| {
                    let mut file = spot_worker_untrusted::open(path, &owners)?;
                    let _ = file.try_lock_shared();
                    Ok(read_at_most(&mut file, 256)?.0.len())
                })
            });
            let read = tokio::time::timeout(Duration::from_secs(1), reading).await??;
            ensure!(read? > 0);
            times.push(started.elapsed());
        }
        Ok::<_, anyhow::Error>(times)
    })?;
    println!("\n1. a rendezvous look: {PEERS} live peers, {rounds} rounds");
    row("before (File::open, read_to_string)", &baseline, None);
    row("hardened", &hardened, Some(&baseline));
    row(
        "hardened, blocking thread + timeout",
        &off_runtime,
        Some(&baseline),
    );
    drop(held);
    Ok(())
}

/// Lists `group` and reads each member file with `read`; the bytes read.
fn look(group: &Path, read: impl Fn(&Path) -> Result<usize>) -> Result<usize> {
    let mut total = 0;
    for entry in std::fs::read_dir(group)? {
        total += read(&entry?.path())?;
    }
    Ok(total)
}

fn sweep(rounds: usize) -> Result<()> {
    let root = tempfile::tempdir()?;
    for dir in 0..DIRECTORIES {
        let dir = root.path().join(format!("spot-worker-{dir:06}"));
        std::fs::create_dir_all(dir.join("work"))?;
        // Another runner's, as an earlier version wrote it: left alone.
        std::fs::write(dir.join("runner"), "4194304 1")?;
    }
    let baseline = measure(rounds, || Ok(std::fs::read_dir(root.path())?.count()))?;
    let swept = measure(rounds, || {
        let swept = spot_worker_command::sweep_leftovers(Some(root.path()));
        ensure!(swept.foreign == DIRECTORIES && swept.directories == 0);
        Ok(swept.foreign)
    })?;
    println!(
        "\n2. the start-up sweep: {DIRECTORIES} delivery directories of other runners, {rounds} rounds"
    );
    row("listing the work root (baseline)", &baseline, None);
    row("sweep_leftovers", &swept, Some(&baseline));
    let per_directory =
        (median(&swept).as_secs_f64() - median(&baseline).as_secs_f64()) / DIRECTORIES as f64;
    println!(
        "   per directory (median − median) / {DIRECTORIES}: {:.2} µs",
        per_directory * 1e6
    );
    Ok(())
}

/// `rounds` timings of `work`.
fn measure(rounds: usize, work: impl Fn() -> Result<usize>) -> Result<Vec<Duration>> {
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        let done = work()?;
        times.push(started.elapsed());
        ensure!(done > 0);
    }
    Ok(times)
}

fn row(label: &str, times: &[Duration], baseline: Option<&[Duration]>) {
    let ratio = baseline.map_or_else(String::new, |baseline| {
        format!(
            "   ratio {:.2}",
            median(times).as_secs_f64() / median(baseline).as_secs_f64()
        )
    });
    println!(
        "   {label:<40} median {:>8.1} µs   p99 {:>8.1} µs{ratio}",
        median(times).as_secs_f64() * 1e6,
        percentile(times, 99.0).as_secs_f64() * 1e6,
    );
}
