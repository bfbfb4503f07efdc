//! The fleet's bill (issue 39, item 3): workers write their own lifetime
//! records, and `spot-worker status` sums them by lane into the VM-hours
//! paid, split busy / idle / starting / draining, with the money.

use std::sync::Arc;
use std::time::Instant;

use spot_worker_decisions::bill::Tally;
use spot_worker_decisions::lanes::Lane;
use spot_worker_storage::{LifetimeLog, MessageEncoding};
use spot_worker_testkit::counting::CountingStore;

use super::common::*;

const REGULAR: &str = "jobs-regular";

async fn status_json(command: &mut tokio::process::Command, more: &[&str]) -> serde_json::Value {
    let output = run(command.args(["status", "--json"]).args(more)).await;
    output.assert_success();
    serde_json::from_str(&output.stdout).unwrap()
}

fn hours(value: &serde_json::Value) -> f64 {
    value
        .as_f64()
        .unwrap_or_else(|| panic!("{value} is no number"))
}

/// Two real workers, one per lane: the Spot one runs a job of 2 s, the
/// regular one has none. Their records say so after they stop, and
/// status splits and prices their time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_lifetimes_are_written_and_read_back_by_status() {
    let azurite = start_azurite();
    let storage = deployed(&azurite).await;
    storage
        .queue(REGULAR)
        .unwrap()
        .create_if_missing()
        .await
        .unwrap();
    let began = Instant::now();
    let cli = || {
        let mut command = spot_worker(&azurite, MessageEncoding::Text);
        command
            .env("SPOT_WORKER_PRICE_PER_HOUR", "1")
            .env("SPOT_WORKER_REGULAR_PRICE_PER_HOUR", "3");
        command
    };
    // Only the regular worker is told of the lanes: the Spot one is a
    // plain worker (the Spot lane is the default), fed a plain message.
    let worker = |lane: &str| {
        let mut command = cli();
        if lane == "regular" {
            command.env("SPOT_WORKER_REGULAR_QUEUE", REGULAR);
        }
        start_worker(
            command
                .args(["run", "--"])
                .args(["sh", "-c", "sleep 2; echo done > \"$SPOT_WORKER_RESULT\""])
                .env("SPOT_WORKER_LANE", lane),
        )
    };
    let mut spot = worker("spot");
    let mut regular = worker("regular");
    // Each writes its record as its warmup ends.
    poll_until("both workers' first records", || async {
        let status = status_json(&mut cli(), &[]).await;
        let running = |lane: &str| status["bill"][lane]["running"].as_u64();
        (running("spot") == Some(1) && running("regular") == Some(1)).then_some(())
    })
    .await;
    let (_dir, path) = input_file("{\"n\":1}\n");
    let sent = run(cli().args(["enqueue", "--raw"]).arg(&path)).await;
    sent.assert_success();
    let id = sent.message_id();
    poll_until("the job's result", || async {
        let got = run(cli().args(["results", "get", &id])).await;
        (got.code == Some(0)).then_some(())
    })
    .await;
    for worker in [&mut spot, &mut regular] {
        assert_eq!(stop_with_sigterm(worker).await.code(), Some(0));
    }
    let wall_hours = began.elapsed().as_secs_f64() / 3600.0;

    let status = status_json(&mut cli(), &[]).await;
    let bill = &status["bill"];
    for lane in ["spot", "regular"] {
        let lane_bill = &bill[lane];
        assert_eq!(lane_bill["workers"], 1, "{bill}");
        assert_eq!(lane_bill["exited"], 1, "{bill}");
        assert_eq!(lane_bill["lost"], 0, "{bill}");
        let paid = hours(&lane_bill["paid_hours"]);
        let parts: f64 = [
            "busy_hours",
            "idle_hours",
            "starting_hours",
            "draining_hours",
        ]
        .iter()
        .map(|part| hours(&lane_bill[*part]))
        .sum();
        assert!((paid - parts).abs() < 1e-9, "{bill}");
        assert!(
            paid > 0.0 && paid <= wall_hours,
            "{paid} of {wall_hours}: {bill}"
        );
        assert!(hours(&lane_bill["idle_hours"]) > 0.0, "{bill}");
        assert!(hours(&lane_bill["starting_hours"]) > 0.0, "{bill}");
    }
    // The job ran 2 s on the Spot worker and nothing on the regular one.
    let spot_busy_s = hours(&bill["spot"]["busy_hours"]) * 3600.0;
    assert!(
        spot_busy_s >= 2.0 && spot_busy_s < wall_hours * 3600.0,
        "{bill}"
    );
    assert_eq!(hours(&bill["regular"]["busy_hours"]), 0.0, "{bill}");
    // Each lane at its price.
    for (lane, price) in [("spot", 1.0), ("regular", 3.0)] {
        let cost = hours(&bill[lane]["cost"]);
        let paid = hours(&bill[lane]["paid_hours"]);
        assert!((cost - paid * price).abs() < 1e-12, "{bill}");
    }
    let text = run(cli().arg("status")).await;
    text.assert_success();
    for expected in [
        "bill    Spot: ",
        "bill    regular: ",
        "by 1 worker(s) (0 running, 1 exited, 0 lost)",
    ] {
        assert!(
            text.stdout.contains(expected),
            "{expected:?} in:\n{}",
            text.stdout
        );
    }
}

/// A thousand workers writing their records at once never race: each
/// writes its own, so every write is one request (no conflict, no retry
/// read), and status reads all of them back. The thousand run together,
/// their writes interleaved; at most [`IN_FLIGHT`] requests are out at a
/// time, so that one Azurite on a busy test machine answers each within
/// the client's deadline (a fleet's workers each have their own link).
const IN_FLIGHT: usize = 32;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_workers_write_their_records_at_once_without_a_conflict() {
    const WORKERS: u64 = 1000;
    let azurite = start_azurite();
    let storage = deployed(&azurite).await;
    let blobs = prepared_checkpoints(&storage).await;
    let store = Arc::new(CountingStore::new(blobs));
    let calls = Arc::clone(store.calls());
    let requests = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let mut writers = tokio::task::JoinSet::new();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    for i in 0..WORKERS {
        let (store, requests) = (Arc::clone(&store), Arc::clone(&requests));
        writers.spawn(async move {
            let worker = format!("vm-{i}");
            let log = LifetimeLog::for_worker(store, &worker);
            // Ten minutes ago it started; a minute of warmup.
            let mut tally = Tally::started(now_ms - 600_000);
            tally.ready(now_ms - 540_000);
            let request = requests.acquire().await.unwrap();
            log.write(&tally.record(&worker, QUEUE, Lane::Spot, now_ms - 540_000))
                .await?;
            drop(request);
            // Six minutes busy, two idle, a minute draining.
            tally.took(now_ms - 540_000);
            tally.finished(now_ms - 180_000);
            tally.draining(now_ms - 60_000);
            tally.exited(now_ms);
            let _request = requests.acquire().await.unwrap();
            log.write(&tally.record(&worker, QUEUE, Lane::Spot, now_ms))
                .await
        });
    }
    while let Some(written) = writers.join_next().await {
        written.unwrap().unwrap();
    }
    assert_eq!(
        (calls.creates(), calls.updates(), calls.reads()),
        (WORKERS, WORKERS, 0),
        "one create and one update per worker, no conflict retry"
    );

    let status = status_json(
        &mut spot_worker(&azurite, MessageEncoding::Text),
        &["--max-reads", "1000"],
    )
    .await;
    let spot = &status["bill"]["spot"];
    assert_eq!(spot["workers"], WORKERS, "{spot}");
    assert_eq!(spot["exited"], WORKERS, "{spot}");
    let expect_hours = |minutes: f64| WORKERS as f64 * minutes / 60.0;
    for (part, minutes) in [
        ("paid_hours", 10.0),
        ("starting_hours", 1.0),
        ("busy_hours", 6.0),
        ("idle_hours", 2.0),
        ("draining_hours", 1.0),
    ] {
        assert!(
            (hours(&spot[part]) - expect_hours(minutes)).abs() < 1e-6,
            "{part}: {spot}"
        );
    }
    assert_eq!(status["bill"]["not_read"], 0);
}

/// `status` with no worker records says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_without_worker_records_says_so() {
    let azurite = start_azurite();
    let _storage = deployed(&azurite).await;
    let text = run(spot_worker(&azurite, MessageEncoding::Text).arg("status")).await;
    text.assert_success();
    text.assert_stdout_has("bill    no worker lifetime record yet");
}
