//! The one set-up call (`spot_worker::Setup`) gives a worker its logs with no
//! telemetry configured at all, and a `Setup` dropped before it made a
//! worker still delivers the telemetry it collected.
//!
//! The first test runs the REAL worker binary (`examples/primes`, built by
//! `cargo test`, or here if it is missing) against Azurite, with an
//! environment that names its storage and nothing else (no `OTEL_*`, no
//! Application Insights, not even `RUST_LOG`).

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::start_worker;
use spot_worker::Setup;
use spot_worker::settings::Source;
use spot_worker_testkit::Azurite;
use spot_worker_testkit::chaos::worker_binary;
use spot_worker_testkit::otlp::Collector;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{ChildStderr, Command};

/// Bound on every wait: generous for a slow machine, finite for a bug.
const PATIENCE: Duration = Duration::from_secs(120);

/// What the worker logs once it takes work (`crates/runtime`).
const START_LINE: &str = "warmup gate open; taking work";

/// Reads `stderr` into `seen` until a line contains `wanted`; false if the
/// stream ended first.
async fn read_until(
    stderr: &mut Lines<BufReader<ChildStderr>>,
    seen: &mut String,
    wanted: &str,
) -> bool {
    while let Ok(Some(line)) = stderr.next_line().await {
        seen.push_str(&line);
        seen.push('\n');
        if line.contains(wanted) {
            return true;
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_logs_without_any_telemetry_configured() {
    let azurite = tokio::task::spawn_blocking(Azurite::start)
        .await
        .unwrap()
        .expect("azurite starts (run `npm ci --prefix tools/azurite`)");

    let binary = tokio::task::spawn_blocking(worker_binary)
        .await
        .unwrap()
        .expect("the worker binary (built if missing)");
    let mut child = start_worker(
        Command::new(binary)
            .env_clear()
            .env(
                "AZURE_STORAGE_CONNECTION_STRING",
                azurite.connection_string(),
            )
            // Logs are what is under test, on any machine: no Scheduled Events
            // (`tests/it/deploy.rs` runs it with them) and any free health port.
            .env("SPOT_WORKER_IMDS", "off")
            .env("SPOT_WORKER_HEALTH_ADDR", "127.0.0.1:0"),
        Stdio::null(),
    );
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = String::new();

    let started = tokio::time::timeout(PATIENCE, read_until(&mut stderr, &mut seen, START_LINE))
        .await
        .unwrap_or_else(|_| panic!("no start line within {PATIENCE:?}; stderr:\n{seen}"));
    assert!(started, "stderr ended before the start line:\n{seen}");

    // SAFETY: signalling the child we started and still own.
    let pid = child.id().expect("the worker is running") as libc::pid_t;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let stopped = tokio::time::timeout(PATIENCE, read_until(&mut stderr, &mut seen, "stopped"))
        .await
        .unwrap_or_else(|_| panic!("no stop line within {PATIENCE:?}; stderr:\n{seen}"));
    assert!(stopped, "stderr ended before the stop line:\n{seen}");
    let status = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .expect("the worker exits after its drain")
        .unwrap();
    assert!(status.success(), "the worker exited with {status}:\n{seen}");
    for line in ["storage credentials chosen", "health endpoints"] {
        assert!(seen.contains(line), "{line:?} is logged:\n{seen}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setup_dropped_without_a_worker_flushes_its_telemetry() {
    let collector = Collector::default();
    let running = collector.start();
    let endpoint = running.url.clone();
    let source = Source::from_lookup(move |name| match name {
        "OTEL_EXPORTER_OTLP_ENDPOINT" => Some(endpoint.clone()),
        "AZURE_STORAGE_CONNECTION_STRING" => Some("UseDevelopmentStorage=true".to_owned()),
        _ => None,
    })
    .unwrap();
    let setup = Setup::from_source(&source).expect("set up from the settings");
    tracing::info_span!("work before any worker").in_scope(|| tracing::info!("working"));

    // Spans are exported in batches, seconds apart: the drop is what sends
    // this one now, before the assertion.
    drop(setup);
    let received = collector.received();
    assert!(
        received
            .spans()
            .any(|span| span.name == "work before any worker"),
        "the span was exported when the setup was dropped"
    );
}
