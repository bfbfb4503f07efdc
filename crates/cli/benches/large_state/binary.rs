//! Parts 2 and 3: the real `spot-worker run` binary with the training
//! loop of `tests/large/train.py` (the harness of `tests/it/support/large.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Result, ensure};
use spot_worker_storage::MessageQueue as _;
use spot_worker_storage::files::MAX_CHUNK;

use crate::support::large::{MEMORY_BOUND_KIB, Runner, StopSignal, World, epochs, send, sent};
use crate::transfers::median;
use crate::{Options, mb_per_s};

/// The saves the runner logged (`checkpoint saved`) since `from` lines:
/// (bytes read, bytes sent, ms), in order.
fn saves(runner: &Runner, from: usize) -> Vec<(u64, u64, u64)> {
    let field = |line: &str, name: &str| -> u64 {
        line.split_whitespace()
            .find_map(|word| word.strip_prefix(name)?.strip_prefix('='))
            .and_then(|value| value.parse().ok())
            .unwrap_or(0)
    };
    runner
        .log
        .text()
        .lines()
        .filter(|line| line.contains("checkpoint saved"))
        .skip(from)
        .map(|line| {
            (
                field(line, "bytes"),
                field(line, "sent_bytes"),
                field(line, "took_ms"),
            )
        })
        .collect()
}

/// One phase of part 2: what the saves up to a stored epoch sent.
struct Phase {
    label: &'static str,
    /// Bytes of chunk blobs that appeared at the store.
    at_store: u64,
    /// The runner's saves in it: (bytes read, bytes sent, ms).
    saves: Vec<(u64, u64, u64)>,
}

pub async fn run(options: &Options) -> Result<()> {
    let world = World::start().await;
    runner_part(options, &world).await?;
    drain_part(options, &world).await
}

async fn runner_part(options: &Options, world: &World) -> Result<()> {
    let size = options.size;
    world.send("model").await;
    let go = world.go_dir("go-model");
    let (a_epochs, signalled) = (world.path("a-epochs"), world.path("a-signalled"));
    let program = [
        ("TRAIN_SIZE", size.to_string()),
        ("TRAIN_EPOCHS", "5".to_owned()),
        ("TRAIN_GO", go.display().to_string()),
        ("TRAIN_LOG", a_epochs.display().to_string()),
        ("TRAIN_SIGNAL_FILE", signalled.display().to_string()),
    ];
    let mut a = world.runner(&world.emulator, &program, &[]);
    let mut phases = Vec::new();
    let mut before = BTreeMap::new();
    let labels = [
        "first save (all new)",
        "rewritten unchanged",
        "1 % of it changed",
    ];
    for (epoch, label) in (1..).zip(labels) {
        let logged = saves(&a, 0).len();
        world.until_saved("model", epoch, &a).await;
        let now = world.chunk_blobs().await;
        phases.push(Phase {
            label,
            at_store: sent(&before, &now),
            saves: saves(&a, logged),
        });
        before = now;
        if epoch < 3 {
            std::fs::write(go.join(format!("go-{epoch}")), b"")?;
        }
    }
    // A drain with storage stalled as the save of epoch 4 starts; storage
    // answers again at once, so that save finishes within the release.
    let stop = world
        .stop_during_a_save(&a, 4, &go, &a_epochs, &signalled, true)
        .await;
    send(world.blob_pid(), libc::SIGCONT);
    ensure!(
        a.exit().await == Some(0),
        "runner A failed:\n{}",
        a.log.text()
    );
    let peak_a = a.peak.kib();
    ensure!(
        world.saved_epoch("model").await == Some(4),
        "epoch 4 was not saved"
    );

    let mut b = world.runner(
        &world.other_vm,
        &[
            ("TRAIN_SIZE", size.to_string()),
            ("TRAIN_EPOCHS", "5".to_owned()),
        ],
        &[],
    );
    world.result("model", &b).await;
    let peak_b = b.peak.kib();
    b.signal(libc::SIGTERM);
    ensure!(
        b.exit().await == Some(0),
        "runner B failed:\n{}",
        b.log.text()
    );
    let restored = b
        .log
        .line(&["resuming from the saved checkpoint"])
        .unwrap_or_default();

    let region = size / 100;
    let (unchanged, changed) = (phases[1].at_store, phases[2].at_store);
    if options.smoke {
        ensure!(
            phases[0].at_store >= size,
            "the first save sent {}",
            phases[0].at_store
        );
        ensure!(unchanged == 0, "an unchanged save sent {unchanged} bytes");
        let around = 2 * MAX_CHUNK as u64 + (256 << 10);
        ensure!(
            changed >= region && changed <= region + around,
            "a {region}-byte region sent {changed} bytes"
        );
        ensure!(
            peak_a < MEMORY_BOUND_KIB && peak_b < MEMORY_BOUND_KIB,
            "peak RSS {peak_a} KiB, {peak_b} KiB"
        );
        ensure!(epochs(&world.path("a-epochs")).contains(&4));
        return Ok(());
    }
    println!(
        "\n2. spot-worker run, a checkpoint file of {} MiB (and a directory of two small files)",
        size >> 20
    );
    println!("| save | sent (chunk blobs at the store) | the runner's saves: read, sent, took |");
    println!("|---|---|---|");
    for phase in &phases {
        let runs: Vec<String> = phase
            .saves
            .iter()
            .map(|(read, sent, ms)| {
                format!("{} MB, {} MB, {ms} ms", read / 1_000_000, sent / 1_000_000)
            })
            .collect();
        println!(
            "| {} | {} bytes | {} |",
            phase.label,
            phase.at_store,
            runs.join("; ")
        );
    }
    println!(
        "   unchanged: {unchanged} bytes sent; 1 % changed ({region} bytes): {changed} bytes sent ({:.2} × the region)",
        changed as f64 / region as f64
    );
    let full = phases[0].saves.iter().map(|s| s.2).max().unwrap_or(0);
    let rehash = phases[1].saves.iter().map(|s| s.2).max().unwrap_or(0);
    let gib = size as f64 / (1u64 << 30) as f64;
    println!(
        "   a save of new content {:.2} s per GiB ({:.0} MB/s); of unchanged content {:.2} s per GiB (read and hashed, nothing sent)",
        full as f64 / 1e3 / gib,
        mb_per_s(size, full as f64 / 1e3),
        rehash as f64 / 1e3 / gib
    );
    println!(
        "   peak RSS (VmHWM): runner A (the saves) {:.1} MB, runner B (the restore, one save) {:.1} MB; bound 64 MB",
        peak_a as f64 * 1.024 / 1e3,
        peak_b as f64 * 1.024 / 1e3
    );
    println!(
        "   runner B: {}",
        restored
            .split("resuming from the saved checkpoint")
            .nth(1)
            .unwrap_or("")
            .trim()
    );
    println!(
        "   the drain above: stop signal {:.1} ms after SIGTERM with storage stalled (an idle process {:.1} ms)",
        stop.program_ms, stop.idle_ms
    );
    Ok(())
}

/// Part 3: drains with a save in flight, storage stalled or answering.
async fn drain_part(options: &Options, world: &World) -> Result<()> {
    let mut stalled: Vec<StopSignal> = Vec::new();
    let mut answering: Vec<StopSignal> = Vec::new();
    for run in 0..2 * options.drains {
        let stall = run % 2 == 0;
        let (queue, job) = (format!("drains{run}"), format!("drain-{run}"));
        let jobs = world.storage.queue(&queue)?;
        jobs.prepare().await?;
        jobs.send(&format!(r#"{{"job_id":"{job}"}}"#), Duration::ZERO)
            .await?;
        let go = world.go_dir(&format!("go-{job}"));
        let (log, signalled) = (
            world.path(&format!("{job}-epochs")),
            world.path(&format!("{job}-signalled")),
        );
        let program = [
            ("TRAIN_SIZE", options.drain_size.to_string()),
            ("TRAIN_GO", go.display().to_string()),
            ("TRAIN_LOG", log.display().to_string()),
            ("TRAIN_SIGNAL_FILE", signalled.display().to_string()),
        ];
        let settings = [
            ("SPOT_WORKER_QUEUE", queue.as_str()),
            ("SPOT_WORKER_DRAIN_BUDGET", "4s"),
            ("SPOT_WORKER_RELEASE_MARGIN", "1s"),
            ("SPOT_WORKER_RELEASE_FLOOR", "500ms"),
        ];
        let mut runner = world.runner(&world.emulator, &program, &settings);
        world.until_saved(&job, 1, &runner).await;
        let stop = world
            .stop_during_a_save(&runner, 2, &go, &log, &signalled, stall)
            .await;
        if stall {
            send(world.blob_pid(), libc::SIGCONT);
        }
        ensure!(
            runner.exit().await == Some(0),
            "a drain failed:\n{}",
            runner.log.text()
        );
        if stall {
            stalled.push(stop)
        } else {
            answering.push(stop)
        }
    }
    if options.smoke {
        return Ok(());
    }
    println!(
        "\n3. drain (SIGTERM) → the program's stop signal, a save of {} MiB in flight, {} drain(s) each",
        options.drain_size >> 20,
        options.drains
    );
    println!("| storage | median | max | an idle process signalled at once: median |");
    println!("|---|---|---|---|");
    for (label, runs) in [
        ("stalled (SIGSTOP of the blob service)", &stalled),
        ("answering", &answering),
    ] {
        let program: Vec<f64> = runs.iter().map(|s| s.program_ms).collect();
        let idle: Vec<f64> = runs.iter().map(|s| s.idle_ms).collect();
        let max = program.iter().copied().fold(0.0, f64::max);
        println!(
            "| {label} | {:.1} ms | {max:.1} ms | {:.2} ms |",
            median(program),
            median(idle)
        );
    }
    println!("   goal: within 50 ms whatever storage does");
    Ok(())
}
