//! How big is the container image, and how long from `podman run` to a
//! worker taking work? On Spot, a replacement VM or pod pulls the image and
//! starts the worker after every eviction, so both are time lost per
//! eviction.
//!
//! `cargo bench --bench image_start [-- --runs N]`
//!
//! Under `cargo test --all-targets` (no `--bench` flag) it runs one run of
//! each instead, so the benchmark cannot rot unnoticed.
//!
//! Everything is real except the cloud: the image as `scripts/build-image.sh`
//! builds it from the binaries of the `image` profile, statically linked
//! (`scripts/build-static.sh`), podman through `scripts/podman.sh`, a real
//! Azurite and the IMDS emulator on loopback (`--network host`). Each run
//! times from spawning `podman run` (the image's default command, the
//! `primes` worker) to the worker's log line "warmup gate open; taking
//! work", read as it is written; then stops the container. The baseline,
//! measured in the same run, is the same `primes` binary started directly
//! on the host with the same settings: the ratio is what the container
//! costs. The figures are medians over the runs; the image's size is
//! podman's (`podman image inspect --format {{.Size}}`).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use spot_worker_testkit::bench::{self, BenchArgs};
use spot_worker_testkit::chaos::static_binaries;
use spot_worker_testkit::worker::{Env, VM_A};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// What the worker logs once it takes work (`crates/runtime`).
const START_LINE: &str = "warmup gate open; taking work";
/// Bound on one start.
const PATIENCE: Duration = Duration::from_secs(120);

fn main() -> Result<()> {
    let args = BenchArgs::from_env();
    let mut runs: usize = if args.benchmarking() { 9 } else { 1 };
    args.each_flag(|flag, value| {
        if flag == "--runs" {
            runs = value.parse()?;
        }
        Ok(())
    })?;
    ensure!(runs >= 1, "--runs must be at least 1");
    if !spot_worker_testkit::podman::container_test_wanted("the image start-up benchmark") {
        return Ok(());
    }
    bench::init_logs();
    bench::runtime()?.block_on(measure(runs))
}

async fn measure(runs: usize) -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..10];
    let image = format!("localhost/spot-worker:bench-{suffix}");
    let _cleanup = RemoveImage(image.clone());
    let (cli, primes) = tokio::task::spawn_blocking(static_binaries).await??;
    let build = Command::new(root.join("scripts/build-image.sh"))
        .env("IMAGE", &image)
        .env("SPOT_WORKER_BINARY", &cli)
        .env("PRIMES_BINARY", &primes)
        .output()
        .await?;
    ensure!(
        build.status.success(),
        "building the image failed: {}",
        String::from_utf8_lossy(&build.stderr)
    );
    let size: u64 = podman_stdout(&["image", "inspect", "--format", "{{.Size}}", &image])
        .await?
        .parse()
        .context("the image's size")?;

    let env = Env::start().await;
    let settings = env.process_env(VM_A, &format!("results-{suffix}"));

    println!("image start-up: {}", bench::machine());
    let mut in_container = Vec::new();
    let mut on_host = Vec::new();
    for run in 0..runs {
        let name = format!("spot-worker-bench-{suffix}-{run}");
        let mut podman = Command::new(root.join("scripts/podman.sh"));
        podman.args(["run", "--rm", "--name", &name, "--network", "host"]);
        for (key, value) in &settings {
            podman.arg("--env").arg(format!("{key}={value}"));
        }
        podman.arg(&image);
        let took = time_to_work(podman).await;
        let _ = podman_stdout(&["rm", "--force", "--ignore", &name]).await;
        in_container.push(took.with_context(|| format!("run {run} in the container"))?);

        let mut host = Command::new(&primes);
        host.envs(settings.iter().map(|(k, v)| (*k, v.as_str())))
            .env("NO_PROXY", "127.0.0.1,localhost");
        on_host.push(time_to_work(host).await.context("on the host")?);
    }
    let container = median(&mut in_container);
    let host = median(&mut on_host);
    println!(
        "image size: {:.1} MB ({size} bytes; was 38.1 MB with the release profile's stripped binaries, 195 MB unstripped and dynamically linked)",
        size as f64 / 1e6
    );
    println!(
        "podman run to taking work: median {:.0} ms over {runs} runs (min {:.0}, max {:.0})",
        ms(container),
        ms(in_container[0]),
        ms(in_container[runs - 1])
    );
    println!(
        "the same binary on the host: median {:.0} ms; container / host = {:.1}x",
        ms(host),
        container.as_secs_f64() / host.as_secs_f64()
    );
    Ok(())
}

/// Starts `command` (stdout and stderr piped), and returns how long until
/// either stream carries [`START_LINE`]; then stops it with SIGTERM and
/// waits for it to exit.
async fn time_to_work(mut command: Command) -> Result<Duration> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let started = Instant::now();
    let mut child = command.spawn().context("starting")?;
    let (lines, mut seen) = mpsc::unbounded_channel();
    for stream in [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let lines = lines.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stream).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
    }
    drop(lines);
    let mut log = Vec::new();
    let took = bench::bounded("the worker to take work", PATIENCE, async {
        while let Some(line) = seen.recv().await {
            if line.contains(START_LINE) {
                return Ok(started.elapsed());
            }
            log.push(line);
        }
        anyhow::bail!("it exited first:\n{}", log.join("\n"))
    })
    .await;
    stop(&mut child).await?;
    took
}

/// SIGTERM (podman passes it on to the worker), then the exit, bounded.
async fn stop(child: &mut Child) -> Result<()> {
    if let Some(pid) = child.id() {
        // SAFETY: signals the process this benchmark started.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
    bench::bounded("the worker to exit", PATIENCE, async {
        Ok(child.wait().await?)
    })
    .await?;
    Ok(())
}

/// `scripts/podman.sh ARGS`, which must succeed; its stdout, trimmed.
async fn podman_stdout(args: &[&str]) -> Result<String> {
    let output = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/podman.sh"))
        .args(args)
        .output()
        .await?;
    ensure!(
        output.status.success(),
        "podman {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// Sorts `times` and returns the middle one.
fn median(times: &mut [Duration]) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// Removes the benchmark's image whatever happens.
struct RemoveImage(String);

impl Drop for RemoveImage {
    fn drop(&mut self) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/podman.sh");
        let _ = std::process::Command::new(script)
            .args(["rmi", "--force", &self.0])
            .output();
    }
}
