//! Large state under `spot-worker run`: the real binary on a real Azurite
//! (blob and queue in processes of their own, so the blob service alone
//! can be stalled) with the IMDS emulator, running a Python training loop
//! (`large/train.py`) whose pace the test sets with go-files.
//!
//! - A checkpoint file three times the runner's 64 MB memory bound, with a
//!   checkpoint directory beside it: saved whole once, again unchanged for
//!   nothing, with a 1 % region changed for about that region (counted at
//!   the store: the chunk blobs that appeared). Then the blob service is
//!   stalled (SIGSTOP) as the next save starts, and the runner gets
//!   SIGTERM: the program's stop signal comes within 50 ms of an idle
//!   process's; the save cannot finish before the release, so it is
//!   abandoned, the last complete checkpoint stands and the log says so.
//!   A second runner resumes from it, and the result equals an
//!   uninterrupted run's. Neither runner's peak RSS reaches 64 MB.
//! - A checkpoint directory alone (the parameters in shards, as frameworks
//!   write them), evicted by a real Preempt notice: the program's last
//!   checkpoint on its stop signal is too big to save in the time left at
//!   the throughput measured, so that save is not started, the log says
//!   so, and another VM's runner resumes from the last complete one
//!   exactly.

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;

use spot_worker_imds_emulator::EventSpec;
use spot_worker_storage::files::Manifest;
use spot_worker_storage::files::manifest::Files;
use support::large::{MEMORY_BOUND_KIB, World, epochs, send, sent, uninterrupted};

/// The job every test runs.
const JOB: &str = "train";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_three_times_the_memory_bound_survives_an_eviction_with_storage_stalled() {
    // 192 MiB: three times the memory bound.
    const SIZE: u64 = 192 << 20;
    let world = World::start().await;
    world.send(JOB).await;
    let size = ("TRAIN_SIZE", SIZE.to_string());
    let expected = uninterrupted(vec![size.clone()]);
    let go = world.go_dir("go");
    let (a_epochs, signalled) = (world.path("a-epochs"), world.path("signalled"));
    let program = [
        size.clone(),
        ("TRAIN_GO", go.display().to_string()),
        ("TRAIN_LOG", a_epochs.display().to_string()),
        ("TRAIN_SIGNAL_FILE", signalled.display().to_string()),
    ];
    // A release 3 s after SIGTERM: too soon for a save to wait out the
    // stall.
    let short_release = [
        ("SPOT_WORKER_DRAIN_BUDGET", "4s"),
        ("SPOT_WORKER_RELEASE_MARGIN", "1s"),
        ("SPOT_WORKER_RELEASE_FLOOR", "500ms"),
    ];
    let mut a = world.runner(&world.emulator, &program, &short_release);

    // The first save sends the whole file; the second, of the same
    // parameters written again, sends nothing; the third, with a region
    // of 1 % changed, about that region.
    world.until_saved(JOB, 1, &a).await;
    let first = world.chunk_blobs().await;
    let whole = sent(&BTreeMap::new(), &first);
    assert!(whole >= SIZE, "the first save sent {whole} bytes");
    std::fs::write(go.join("go-1"), b"").unwrap();
    world.until_saved(JOB, 2, &a).await;
    let second = world.chunk_blobs().await;
    assert_eq!(
        sent(&first, &second),
        0,
        "a save of the unchanged file sent chunks"
    );
    std::fs::write(go.join("go-2"), b"").unwrap();
    world.until_saved(JOB, 3, &a).await;
    let third = world.chunk_blobs().await;
    let (changed, region) = (sent(&second, &third), SIZE / 100);
    let around = 2 * spot_worker_storage::files::MAX_CHUNK as u64 + (256 << 10);
    assert!(
        changed >= region && changed <= region + around,
        "a {region}-byte region changed: {changed} bytes sent"
    );
    let expected = expected.await.unwrap();

    // Storage stalls just as the save of epoch 4 starts; then SIGTERM.
    let stop = world
        .stop_during_a_save(&a, 4, &go, &a_epochs, &signalled, true)
        .await;
    // Storage stays stalled past the release: the save is given up, and
    // the last complete checkpoint (epoch 3) stands.
    let given_up = a
        .log
        .wait_for(&["the last complete checkpoint stands"])
        .await;
    send(world.blob_pid(), libc::SIGCONT);
    assert_eq!(a.exit().await, Some(0), "{}", a.log.text());
    assert!(
        stop.program_ms <= stop.idle_ms + 50.0,
        "the stop signal reached the program {:.1} ms after SIGTERM (an idle process: {:.1} ms)\n{}",
        stop.program_ms,
        stop.idle_ms,
        a.log.text()
    );
    assert_eq!(world.saved_epoch(JOB).await, Some(3), "{}", a.log.text());
    let peak_a = a.peak.kib();
    assert!(
        peak_a > 0 && peak_a < MEMORY_BOUND_KIB,
        "runner A peaked at {peak_a} KiB"
    );

    // Another runner resumes from epoch 3; the result is an uninterrupted
    // run's.
    let b_epochs = world.path("b-epochs");
    let mut b = world.runner(
        &world.other_vm,
        &[size, ("TRAIN_LOG", b_epochs.display().to_string())],
        &[],
    );
    let result = world.result(JOB, &b).await;
    let peak_b = b.peak.kib();
    b.signal(libc::SIGTERM);
    assert_eq!(b.exit().await, Some(0), "{}", b.log.text());
    assert_eq!(
        String::from_utf8_lossy(&result),
        String::from_utf8_lossy(&expected),
        "{}",
        b.log.text()
    );
    assert!(
        b.log
            .line(&["resuming from the saved checkpoint"])
            .is_some(),
        "{}",
        b.log.text()
    );
    assert_eq!(epochs(&b_epochs), [4, 5, 6], "resumed after epoch 3");
    assert!(
        peak_b > 0 && peak_b < MEMORY_BOUND_KIB,
        "runner B peaked at {peak_b} KiB"
    );
    eprintln!(
        "stop signal after {:.1} ms (an idle process: {:.1} ms); sent {whole} bytes, then 0, \
         then {changed} for a {region}-byte region; peak RSS A {peak_a} KiB, B {peak_b} KiB; \
         {given_up}",
        stop.program_ms, stop.idle_ms
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_directory_resumes_after_a_notice_whose_final_save_cannot_fit() {
    // Four shards of 12 MiB: saves big enough to measure the throughput.
    const SIZE: u64 = 48 << 20;
    let world = World::start().await;
    world.send(JOB).await;
    let program = |log: &Path| {
        vec![
            ("TRAIN_SIZE", SIZE.to_string()),
            ("TRAIN_LAYOUT", "dir".to_owned()),
            ("TRAIN_LOG", log.display().to_string()),
        ]
    };
    let expected = uninterrupted(program(&world.path("alone-epochs")));
    let go = world.go_dir("go");
    let mut in_a = program(&world.path("a-epochs"));
    in_a.push(("TRAIN_GO", go.display().to_string()));
    // Its last checkpoint, on the stop signal: 100 GB more.
    in_a.push(("TRAIN_ON_STOP", "huge".to_owned()));
    let mut a = world.runner(&world.emulator, &in_a, &[]);
    for epoch in 1..=3 {
        world.until_saved(JOB, epoch, &a).await;
        if epoch < 3 {
            std::fs::write(go.join(format!("go-{epoch}")), b"").unwrap();
        }
    }
    world.emulator.schedule(EventSpec::preempt()).unwrap();
    let skipped = a
        .log
        .wait_for(&[
            "the final save would not finish before the release at the throughput measured",
            "the last complete checkpoint stands",
        ])
        .await;
    assert_eq!(a.exit().await, Some(0), "{}", a.log.text());
    assert_eq!(world.saved_epoch(JOB).await, Some(3), "{}", a.log.text());
    let Some(Manifest {
        files: Files::Listed(files),
        ..
    }) = world.manifest(JOB).await
    else {
        panic!("no manifest listing its files");
    };
    let paths: Vec<&str> = files.iter().map(|file| file.path.as_str()).collect();
    assert!(
        !paths.contains(&"dir/params/final-shard") && paths.contains(&"dir/params/shard-3"),
        "{paths:?}"
    );

    let b_epochs = world.path("b-epochs");
    let mut b = world.runner(&world.other_vm, &program(&b_epochs), &[]);
    let result = world.result(JOB, &b).await;
    b.signal(libc::SIGTERM);
    assert_eq!(b.exit().await, Some(0), "{}", b.log.text());
    assert_eq!(
        String::from_utf8_lossy(&result),
        String::from_utf8_lossy(&expected.await.unwrap()),
        "{}",
        b.log.text()
    );
    assert_eq!(epochs(&b_epochs), [4, 5, 6], "resumed after epoch 3");
    eprintln!("{skipped}");
}
