//! What one look at a checkpoint directory costs at and past its limit
//! (`MAX_ENTRIES`, 10,000 entries, directories counted): the look
//! `spot-worker run` takes before each save, beside the program.
//!
//! `cargo bench --bench checkpoint_dir [-- --iterations N]`
//! (`cargo test --bench checkpoint_dir -- --bench`: the same on the debug
//! build). Under `cargo test --all-targets` it runs a smoke version.
//!
//! Each case is measured two ways in the same run, on the same tree:
//! - **old**: what the walk did before the cap stopped its reading: every
//!   entry of every directory read and stat'ed (`Dir::entries`, the walk's
//!   primitive then) before the count was checked; for 90,300 empty
//!   directories, which were not counted at all, every one opened;
//! - **new**: `CheckpointFiles::fingerprint`, the look itself, which
//!   stops reading at the first entry past the cap and refuses.
//!
//! Real files on the machine's temporary directory; nothing is mocked.

use std::ffi::OsString;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use spot_worker::storage::files::{CheckpointFiles, MAX_ENTRIES, SaveFilesError};
use spot_worker_testkit::bench::{self, BenchArgs, median};
use spot_worker_untrusted::Dir;

fn main() -> Result<()> {
    let args = BenchArgs::from_env();
    let (mut iterations, files, width) = if args.benchmarking() {
        (9, 100_000, 300)
    } else {
        (1, MAX_ENTRIES + 10, 101)
    };
    args.each_flag(|flag, value| {
        if flag == "--iterations" {
            iterations = value.parse()?;
        }
        Ok(())
    })?;
    ensure!(iterations >= 1);
    println!("checkpoint directory benchmark on {}", bench::machine());

    let flat = tempfile::tempdir()?;
    for i in 0..files {
        std::fs::write(flat.path().join(format!("f{i:06}")), b"")?;
    }
    row(
        &format!("{files} files in one directory"),
        flat.path(),
        iterations,
    )?;

    // `width` directories of `width` empty directories each (300: 90,300).
    let nested = tempfile::tempdir()?;
    for i in 0..width {
        let outer = nested.path().join(format!("d{i:03}"));
        std::fs::create_dir(&outer)?;
        for j in 0..width {
            std::fs::create_dir(outer.join(format!("e{j:03}")))?;
        }
    }
    row(
        &format!("{} empty directories", width + width * width),
        nested.path(),
        iterations,
    )?;

    let at_cap = tempfile::tempdir()?;
    for i in 0..MAX_ENTRIES {
        std::fs::write(at_cap.path().join(format!("f{i:06}")), b"")?;
    }
    let mut times = Vec::new();
    for _ in 0..iterations {
        let started = Instant::now();
        let found = CheckpointFiles::dir(at_cap.path()).fingerprint();
        times.push(started.elapsed());
        ensure!(matches!(found, Ok(Some(_))), "{found:?}");
    }
    println!(
        "| {MAX_ENTRIES} files (at the cap: saved) | | {} |",
        ms(median(&times))
    );
    Ok(())
}

/// One row: the old walk's median and the look's, over `iterations`.
fn row(what: &str, root: &Path, iterations: usize) -> Result<()> {
    let (mut old, mut new) = (Vec::new(), Vec::new());
    for _ in 0..iterations {
        let started = Instant::now();
        let seen = walk_all(&Dir::open(root)?)?;
        old.push(started.elapsed());
        ensure!(seen > MAX_ENTRIES);
        let started = Instant::now();
        let found = CheckpointFiles::dir(root).fingerprint();
        new.push(started.elapsed());
        ensure!(
            matches!(found, Err(SaveFilesError::TooMany { .. })),
            "{found:?}"
        );
    }
    let (old, new) = (median(&old), median(&new));
    println!(
        "| {what} | {} | {} (refused) | {:.0}× |",
        ms(old),
        ms(new),
        old.as_secs_f64() / new.as_secs_f64()
    );
    Ok(())
}

/// Every entry below `dir` read and stat'ed, as the walk did before the
/// cap: how many.
fn walk_all(dir: &Dir) -> Result<usize> {
    let mut seen = 0;
    let entries: Vec<(OsString, std::fs::Metadata)> = dir.entries()?;
    for (name, meta) in entries {
        seen += 1;
        if meta.is_dir() {
            seen += walk_all(&dir.dir(&name)?)?;
        }
    }
    Ok(seen)
}

fn ms(time: Duration) -> String {
    format!("{:.1} ms", time.as_secs_f64() * 1e3)
}
