//! The container image (`scripts/build-image.sh`, `container/Containerfile`)
//! of the shipped binaries (the `image` profile), statically linked (no
//! shared library in it) and under 25 MB, built and run with podman
//! against Azurite and the IMDS emulator on loopback (`--network host`):
//! the `primes` worker runs as PID 1 and as a non-root user, takes a job,
//! and `podman stop -t 30` (SIGTERM, then SIGKILL after 30 s) ends it with
//! exit 0 before the 30 s, its progress saved and its message visible again
//! at once.
//!
//! Needs podman and runc (scripts/test.sh installs them and sets
//! `SPOT_WORKER_CONTAINER_TEST=1`, so CI cannot skip it). Without podman the
//! test is skipped with a message; `SPOT_WORKER_CONTAINER_TEST=0` skips it
//! always, `=1` makes a missing podman a failure.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use spot_worker_primes::PrimesJob;
use spot_worker_testkit::chaos::static_binaries;
use spot_worker_testkit::worker::{Env, VM_A, within};

/// What `podman stop -t` is given: a Kubernetes grace period or systemd's
/// stop timeout would be the same kind of bound.
const STOP_TIMEOUT_S: u64 = 30;
/// What the worker logs once it takes work (`crates/runtime`).
const START_LINE: &str = "warmup gate open; taking work";
/// The bound on the image's size (issue 23): every eviction pulls the image
/// onto a fresh VM or node, so its size is start-up time on Spot. Podman's
/// count (`podman image inspect --format {{.Size}}`), in bytes (MB = 10^6,
/// as `podman images` shows it).
const MAX_IMAGE_BYTES: u64 = 25_000_000;

/// `scripts/podman.sh ARGS` (the proven runtime, cgroup and storage settings).
fn podman(args: &[&str]) -> Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/podman.sh");
    Command::new(script)
        .args(args)
        .output()
        .expect("scripts/podman.sh runs")
}

/// `podman ARGS`, which must succeed; its stdout, trimmed.
fn podman_ok(args: &[&str]) -> String {
    let output = podman(args);
    assert!(
        output.status.success(),
        "podman {args:?} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// Removes the test's container and image whatever happens.
struct Cleanup {
    container: String,
    image: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = podman(&["rm", "--force", "--ignore", &self.container]);
        let _ = podman(&["rmi", "--force", &self.image]);
    }
}

/// The image's files (a container created from it, exported) hold no
/// shared library and no dynamic loader: the binaries need none.
fn assert_no_shared_library(cleanup: &Cleanup) {
    let created = format!("{}-files", cleanup.container);
    podman_ok(&["create", "--name", &created, &cleanup.image]);
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("rootfs.tar");
    let exported = podman(&["export", "--output", tar.to_str().unwrap(), &created]);
    let _ = podman(&["rm", "--force", "--ignore", &created]);
    assert!(exported.status.success(), "podman export: {exported:?}");
    let listed = Command::new("tar").arg("-tf").arg(&tar).output().unwrap();
    assert!(listed.status.success(), "tar -t: {listed:?}");
    let files = String::from_utf8_lossy(&listed.stdout);
    assert!(
        files
            .lines()
            .any(|f| f.ends_with("usr/local/bin/spot-worker")),
        "the image's files:\n{files}"
    );
    let libraries: Vec<&str> = files
        .lines()
        .filter(|f| f.contains(".so") || f.contains("ld-linux") || f.contains("lib/"))
        .collect();
    assert!(
        libraries.is_empty(),
        "shared libraries in the image: {libraries:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_drains_on_podman_stop_as_pid_1() {
    if !spot_worker_testkit::podman::container_test_wanted("the container image test") {
        return;
    }
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..10];
    let cleanup = Cleanup {
        container: format!("spot-worker-test-{suffix}"),
        image: format!("localhost/spot-worker:test-{suffix}"),
    };
    // The binaries the image ships: the `image` profile, statically linked.
    let (cli, primes) = tokio::task::spawn_blocking(static_binaries)
        .await
        .unwrap()
        .expect("the static binaries");
    let build = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build-image.sh"))
        .env("IMAGE", &cleanup.image)
        .env("SPOT_WORKER_BINARY", cli)
        .env("PRIMES_BINARY", primes)
        .output()
        .expect("scripts/build-image.sh runs");
    let built = String::from_utf8_lossy(&build.stdout);
    assert!(
        build.status.success(),
        "building the image failed: {built}{}",
        String::from_utf8_lossy(&build.stderr)
    );
    for name in ["spot-worker", "primes"] {
        assert!(
            built.contains(&format!("{name}: statically linked")),
            "{name} is not static:\n{built}"
        );
    }
    assert_no_shared_library(&cleanup);
    let size: u64 = podman_ok(&["image", "inspect", "--format", "{{.Size}}", &cleanup.image])
        .parse()
        .expect("podman prints the image's size in bytes");
    eprintln!("the image is {size} bytes");
    assert!(
        size < MAX_IMAGE_BYTES,
        "the image is {size} bytes, not under {MAX_IMAGE_BYTES}:\n{built}"
    );

    let env = Env::start().await;
    let job = PrimesJob::new("long", 0, 200_000_000_000).unwrap();
    env.enqueue(&job).await;
    let settings = env.process_env(VM_A, &format!("results-{suffix}"));
    let mut run = vec![
        "run",
        "--detach",
        "--name",
        &cleanup.container,
        "--network",
        "host",
    ];
    let pairs: Vec<String> = settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
    for pair in &pairs {
        run.extend(["--env", pair]);
    }
    run.push(&cleanup.image);
    podman_ok(&run);
    let logs = || {
        let output = podman(&["logs", &cleanup.container]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    };

    // Started, as PID 1 and not root; then running the job (it checkpointed).
    within("the worker to take work", async {
        while !logs().contains(START_LINE) {
            let state = podman_ok(&[
                "inspect",
                "--format",
                "{{.State.Status}}",
                &cleanup.container,
            ]);
            assert_eq!(state, "running", "the worker stopped early:\n{}", logs());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    let top = podman_ok(&["top", &cleanup.container, "pid", "user", "args"]);
    let worker_line = top
        .lines()
        .find(|l| l.contains("/usr/local/bin/primes"))
        .unwrap_or_else(|| panic!("the worker in `podman top`:\n{top}"));
    let columns: Vec<&str> = worker_line.split_whitespace().collect();
    assert_eq!(columns[0], "1", "the worker is PID 1:\n{top}");
    assert_eq!(columns[1], "spot-worker", "the worker is not root:\n{top}");
    within("the job's first checkpoint", async {
        while env.checkpoint_cursor("long").await.is_none() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;

    let stopping = Instant::now();
    let timeout = STOP_TIMEOUT_S.to_string();
    podman_ok(&["stop", "--time", &timeout, &cleanup.container]);
    let stopped_in = stopping.elapsed();
    let exit = podman_ok(&[
        "inspect",
        "--format",
        "{{.State.ExitCode}}",
        &cleanup.container,
    ]);
    let log = logs();
    eprintln!("podman stop took {stopped_in:?}");
    assert_eq!(exit, "0", "exit code after podman stop:\n{log}");
    assert!(
        stopped_in < Duration::from_secs(STOP_TIMEOUT_S),
        "drained before podman's SIGKILL ({stopped_in:?}):\n{log}"
    );
    assert!(
        log.contains("released on shutdown"),
        "the job was released:\n{log}"
    );
    assert!(env.checkpoint_cursor("long").await.is_some());
    let back = env.queue.receive(1, Duration::from_secs(5)).await.unwrap();
    assert_eq!(back.len(), 1, "the message is visible again at once");
    assert_eq!(
        PrimesJob::parse(back[0].body.as_bytes()).unwrap().job_id,
        "long"
    );
    drop(cleanup);
}
