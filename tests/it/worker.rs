//! The whole worker end to end, on a real Azurite and the IMDS emulator: the
//! example primes job evicted mid-way and resumed elsewhere, a handler that
//! ignores cancellation, two workers on one queue, two workers on one VM
//! (an approval held until both drained), and the warmup gate.

use std::time::Duration;

use spot_worker::imds::EventType;
use spot_worker::runtime::{DrainTrigger, Gate};
use spot_worker::storage::{HandlerError, Job, handler_fn};
use spot_worker_imds_emulator::{EventSpec, Fault};
use spot_worker_primes::PrimesJob;
use spot_worker_testkit::worker::*;

use crate::common::{another_worker_resumes, stubborn_handler};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempt_mid_job_drains_in_time_and_another_worker_resumes() {
    let env = Env::start().await;
    // Big enough (about 2 s in a debug build) that the eviction lands mid-job.
    let job = PrimesJob::new("j1", 0, 100_000_000).unwrap();
    env.enqueue(&job).await;

    // Worker A, on spotvmss_0, is evicted once a third of the job is done.
    let a = env.primes_worker(VM_A);
    let progress = a.progress.clone();
    let running = tokio::spawn(a.worker.run(a.handler));
    within("a third of the job", progress.reached("j1", 33_000_000)).await;
    let eviction = env
        .emulator
        .schedule(EventSpec::preempt().resources([VM_A]))
        .unwrap();
    let report = within("worker A to drain", running).await.unwrap().unwrap();

    let DrainTrigger::Event(notice) = &report.drain.trigger else {
        panic!("drained for {:?}", report.drain.trigger);
    };
    assert_eq!(notice.event_type, EventType::Preempt);
    assert_eq!(notice.event_id.as_str(), eviction.id);
    assert!(report.drain.met_deadline, "{:?}", report.drain);
    assert!(
        report.drain.notice_to_drained < Duration::from_secs(5),
        "a cooperative handler drains in well under the 30 s notice: {:?}",
        report.drain.notice_to_drained
    );
    assert!(
        !report.drain.released_running_handlers,
        "it checkpointed and returned"
    );
    assert_eq!(report.stats.released, 1);
    assert!(
        report.drain.approved_event,
        "the eviction was approved after the drain"
    );
    assert!(
        env.emulator
            .approvals()
            .iter()
            .any(|a| a.event_id == eviction.id)
    );
    let stopped_at = env
        .checkpoint_cursor("j1")
        .await
        .expect("progress checkpointed");
    assert!(
        (33_000_000..100_000_000).contains(&stopped_at),
        "{stopped_at}"
    );

    // Worker B, on another VM, takes the released message at once and
    // resumes from the checkpoint.
    let resumed_from = another_worker_resumes(&env, &job).await;
    assert!(
        resumed_from >= stopped_at,
        "B resumed at {resumed_from}, not before A's checkpoint at {stopped_at}"
    );
    env.assert_queues_empty().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_ignores_cancellation_is_cut_off_and_its_message_released() {
    let env = Env::start().await;
    env.queue.send("stubborn", Duration::ZERO).await.unwrap();
    let mut config = env.config(VM_A);
    config.drain.drain_budget = Duration::from_secs(4);
    config.drain.release_margin = Duration::from_secs(2);
    let (started, handler) = stubborn_handler();
    let worker = env.worker(config);
    let stop = worker.shutdown_token();
    let mut readiness = worker.readiness();
    let running = tokio::spawn(worker.run(handler));
    within("the handler to start", started.notified()).await;
    assert!(readiness.borrow().is_ready());
    stop.cancel();
    // Readiness turns false the moment the drain starts, while the handler
    // is still running (it is only cut off at the release instant).
    let draining = within("readiness to drop", readiness.wait_for(|r| !r.is_ready()))
        .await
        .unwrap()
        .clone();
    assert_eq!(
        draining.shutting_down.as_deref(),
        Some("shutdown requested")
    );
    assert!(!running.is_finished());
    let report = within("the drain", running).await.unwrap().unwrap();

    assert!(report.drain.released_running_handlers);
    assert!(report.drain.met_deadline, "{:?}", report.drain);
    assert_eq!(report.stats.released, 1);
    // Released at the release instant (budget minus margin), not later.
    let took = report.drain.notice_to_drained;
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(4),
        "{took:?}"
    );
    // Visible again at once for another consumer.
    let again = env.queue.receive(1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(again.len(), 1, "the message is back on the queue");
    assert_eq!(again[0].body, "stubborn");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_on_one_queue_never_write_conflicting_results() {
    let env = Env::start().await;
    let jobs: Vec<PrimesJob> = (0..6)
        .map(|i| {
            PrimesJob::new(format!("job{i}"), i * 400_000, (i + 1) * 400_000 + 150_000).unwrap()
        })
        .collect();
    for job in &jobs {
        env.enqueue(job).await;
    }
    let a = env.primes_worker(VM_A);
    let b = env.primes_worker(VM_B);
    let progress_a = a.progress.clone();
    let (stop_b,) = (b.worker.shutdown_token(),);
    let running_a = tokio::spawn(a.worker.run(a.handler));
    let running_b = tokio::spawn(b.worker.run(b.handler));
    // Evict A once it is busy, so B also takes over a half-done job.
    within("A to make progress", progress_a.any_progress()).await;
    env.emulator
        .schedule(EventSpec::preempt().resources([VM_A]))
        .unwrap();
    within("A to drain", running_a).await.unwrap().unwrap();

    for job in &jobs {
        let result = within("every result", env.result(&job.job_id)).await;
        assert_eq!(
            result,
            spot_worker_primes::expected_result(job),
            "{}",
            job.job_id
        );
    }
    stop_b.cancel();
    within("B to stop", running_b).await.unwrap().unwrap();
    env.assert_queues_empty().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_keeps_the_worker_idle_while_imds_is_down() {
    let env = Env::start().await;
    env.queue.send("waiting", Duration::ZERO).await.unwrap();
    env.emulator.inject_faults(
        Fault::Status(reqwest::StatusCode::SERVICE_UNAVAILABLE),
        1000,
    );
    let handled = Handled::default();
    let handler = handled.handler();
    let (worker, health_url) = env.worker_with_health(env.config(VM_A)).await;
    let readiness = worker.readiness();
    let stop = worker.shutdown_token();
    let running = tokio::spawn(worker.run(handler));

    // IMDS fails again and again; the gate stays closed and says why.
    within("IMDS to be retried", async {
        while env.emulator.stats().faults_served < 3 {
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let (status, body) = get(&format!("{health_url}/readyz")).await;
    assert_eq!(status, 503);
    assert_eq!(body["ready"], false);
    assert_eq!(body["imds"]["state"], "waiting");
    assert!(matches!(readiness.borrow().imds, Gate::Waiting(_)));
    assert!(
        !handled.happened(),
        "nothing taken while the gate is closed"
    );

    // IMDS recovers: the gate opens and the message is handled.
    env.emulator.clear_faults();
    within("the message to be handled", handled.wait()).await;
    let (status, body) = get(&format!("{health_url}/readyz")).await;
    assert_eq!(
        (status, body["ready"].clone()),
        (200, serde_json::Value::Bool(true))
    );
    stop.cancel();
    within("the worker to stop", running)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_keeps_the_worker_idle_while_storage_is_down() {
    let mut env = Env::start().await;
    env.queue.send("waiting", Duration::ZERO).await.unwrap();
    env.azurite.stop().expect("azurite stops");
    let handled = Handled::default();
    let handler = handled.handler();
    let worker = env.worker(env.config(VM_A));
    let mut readiness = worker.readiness();
    let stop = worker.shutdown_token();
    let running = tokio::spawn(worker.run(handler));

    within(
        "the storage gate to report the outage",
        readiness.wait_for(|r| matches!(&r.storage, Gate::Waiting(detail) if detail != "checking")),
    )
    .await
    .unwrap();
    assert!(!readiness.borrow().is_ready());
    assert!(
        !handled.happened(),
        "nothing taken while the gate is closed"
    );

    env.azurite
        .start_again()
        .expect("azurite restarts on its data");
    within("the message to be handled", handled.wait()).await;
    assert!(readiness.borrow().is_ready());
    stop.cancel();
    within("the worker to stop", running)
        .await
        .unwrap()
        .unwrap();
}

/// A handler that reports every body it handles on a channel.
fn reporting_handler() -> (
    impl spot_worker::storage::MessageHandler,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let handler = handler_fn(move |job: Job| {
        let tx = tx.clone();
        async move {
            let _ = tx.send(job.text()?.to_owned());
            Ok::<(), HandlerError>(())
        }
    });
    (handler, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_reboot_is_not_approved_and_the_worker_waits_then_resumes_when_it_is_cancelled() {
    let env = Env::start().await;
    env.queue.send("before", Duration::ZERO).await.unwrap();
    let (handler, mut handled) = reporting_handler();
    let (worker, health_url) = env.worker_with_health(env.config(VM_A)).await;
    let mut readiness = worker.readiness();
    let stop = worker.shutdown_token();
    let running = tokio::spawn(worker.run(handler));
    assert_eq!(
        within("the first message", handled.recv()).await.unwrap(),
        "before"
    );

    // A Reboot of this VM and a peer: approving it would start it for both.
    let reboot = env
        .emulator
        .schedule(EventSpec::reboot().resources([VM_A, VM_B]))
        .unwrap();
    let parked = within(
        "the worker to drain and wait",
        readiness.wait_for(|r| {
            r.shutting_down
                .as_deref()
                .is_some_and(|why| why.contains("waiting for it to start or be cancelled"))
        }),
    )
    .await
    .unwrap()
    .clone();
    let why = parked.shutting_down.unwrap();
    assert!(why.contains(&reboot.id), "{why}");
    assert!(why.contains("also concerns other VMs"), "{why}");
    let (status, body) = get(&format!("{health_url}/readyz")).await;
    assert_eq!(status, 503);
    assert_eq!(body["shutting_down"], serde_json::Value::String(why));
    assert!(env.emulator.approvals().is_empty(), "nothing approved");
    assert!(
        !running.is_finished(),
        "up, not exiting into a restart loop"
    );
    // Taking nothing while it waits.
    env.queue.send("after", Duration::ZERO).await.unwrap();

    // Maintenance called off: the worker takes work again.
    env.emulator.cancel_event(&reboot.id).unwrap();
    within("readiness to return", readiness.wait_for(|r| r.is_ready()))
        .await
        .unwrap();
    assert_eq!(
        within("the next message", handled.recv()).await.unwrap(),
        "after"
    );
    let (status, _) = get(&format!("{health_url}/readyz")).await;
    assert_eq!(status, 200);

    stop.cancel();
    let report = within("the worker to stop", running)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(report.drain.resumed, 1);
    assert_eq!(report.drain.trigger, DrainTrigger::Requested);
    assert_eq!(report.stats.succeeded, 2);
    assert!(env.emulator.approvals().is_empty(), "never approved");
    env.assert_queues_empty().await;
}

/// Starts a worker as VM_A, schedules a Reboot of VM_A and VM_B, and waits
/// until the worker has drained and parked.
async fn parked_worker(
    env: &Env,
) -> (
    tokio::task::JoinHandle<
        Result<spot_worker::runtime::RunReport, spot_worker::runtime::WorkerError>,
    >,
    tokio_util::sync::CancellationToken,
    String,
) {
    let (handler, _handled) = reporting_handler();
    let worker = env.worker(env.config(VM_A));
    let mut readiness = worker.readiness();
    let stop = worker.shutdown_token();
    let running = tokio::spawn(worker.run(handler));
    within("the gate", readiness.wait_for(|r| r.is_ready()))
        .await
        .unwrap();
    let reboot = env
        .emulator
        .schedule(EventSpec::reboot().resources([VM_A, VM_B]))
        .unwrap();
    within(
        "the worker to park",
        readiness.wait_for(|r| {
            r.shutting_down
                .as_deref()
                .is_some_and(|why| why.contains("waiting for it to start"))
        }),
    )
    .await
    .unwrap();
    (running, stop, reboot.id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_worker_exits_when_the_event_starts_or_it_is_told_to() {
    let env = Env::start().await;
    // A peer approved it (or NotBefore came): the VM is going down.
    let (running, _stop, reboot) = parked_worker(&env).await;
    env.emulator.start_event(&reboot).unwrap();
    let report = within("the exit", running).await.unwrap().unwrap();
    assert!(matches!(report.drain.trigger, DrainTrigger::Event(_)));
    assert!(!report.drain.approved_event);
    assert!(env.emulator.approvals().is_empty());

    // A stop while parked (SIGTERM takes the same path) exits at once.
    env.emulator.complete_event(&reboot).unwrap();
    let (running, stop, _) = parked_worker(&env).await;
    let asked = tokio::time::Instant::now();
    stop.cancel();
    within("the exit", running).await.unwrap().unwrap();
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    assert!(env.emulator.approvals().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_event_pending_at_start_does_not_make_the_worker_exit() {
    let env = Env::start().await;
    // What a restarted worker would find: the same pending shared Reboot.
    let reboot = env
        .emulator
        .schedule(EventSpec::reboot().resources([VM_A, VM_B]))
        .unwrap();
    env.queue.send("later", Duration::ZERO).await.unwrap();
    let (handler, mut handled) = reporting_handler();
    let worker = env.worker(env.config(VM_A));
    let mut readiness = worker.readiness();
    let stop = worker.shutdown_token();
    let running = tokio::spawn(worker.run(handler));
    within(
        "the worker to wait for the event",
        readiness.wait_for(|r| {
            r.shutting_down
                .as_deref()
                .is_some_and(|why| why.contains("waiting for it to start"))
        }),
    )
    .await
    .unwrap();
    assert!(!running.is_finished(), "no exit into a restart loop");
    assert!(env.emulator.approvals().is_empty());

    env.emulator.cancel_event(&reboot.id).unwrap();
    assert_eq!(
        within("the message", handled.recv()).await.unwrap(),
        "later"
    );
    stop.cancel();
    within("the worker to stop", running)
        .await
        .unwrap()
        .unwrap();
    assert!(env.emulator.approvals().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_event_is_approved_when_the_deployment_opts_in() {
    let env = Env::start().await;
    let mut config = env.config(VM_A);
    config.drain.approve_shared_events = true;
    let (handler, _handled) = reporting_handler();
    let worker = env.worker(config);
    let mut readiness = worker.readiness();
    let running = tokio::spawn(worker.run(handler));
    within("the gate", readiness.wait_for(|r| r.is_ready()))
        .await
        .unwrap();
    let reboot = env
        .emulator
        .schedule(EventSpec::reboot().resources([VM_A, VM_B]))
        .unwrap();
    let report = within("the drain", running).await.unwrap().unwrap();
    assert!(report.drain.approved_event, "{:?}", report.drain);
    assert!(
        env.emulator
            .approvals()
            .iter()
            .any(|a| a.event_id == reboot.id)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_already_started_preempt_still_releases_the_message_in_flight() {
    let env = Env::start().await;
    env.queue.send("in flight", Duration::ZERO).await.unwrap();
    let mut config = env.config(VM_A);
    // The real watchdog, in this process: before the release floor it ended
    // the process (status 3) the moment a started event was seen.
    config.drain.watchdog = true;
    config.drain.release_floor = Duration::from_secs(3);
    let (started, handler) = stubborn_handler();
    let worker = env.worker(config);
    let running = tokio::spawn(worker.run(handler));
    within("the handler to start", started.notified()).await;

    // Seen only once it has started (a host failure, or after an outage).
    let preempt = env
        .emulator
        .schedule(EventSpec::preempt().started())
        .unwrap();
    let report = within("the drain", running).await.unwrap().unwrap();

    let DrainTrigger::Event(notice) = &report.drain.trigger else {
        panic!("drained for {:?}", report.drain.trigger);
    };
    assert_eq!(notice.event_id.as_str(), preempt.id);
    assert_eq!(notice.status.as_str(), "Started");
    assert_eq!(report.stats.released, 1, "released, not left hidden");
    assert!(report.drain.met_deadline, "{:?}", report.drain);
    assert!(
        report.drain.notice_to_drained < Duration::from_secs(3),
        "{:?}",
        report.drain.notice_to_drained
    );
    // Visible again at once, not after its 10 s visibility timeout.
    let again = env.queue.receive(1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(again.len(), 1, "the message is back on the queue");
    assert_eq!(again[0].body, "in flight");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_already_started_preempt_still_lets_a_handler_make_its_final_save() {
    let env = Env::start().await;
    env.queue.send("late", Duration::ZERO).await.unwrap();
    let mut config = env.config(VM_A);
    config.drain.watchdog = true;
    config.drain.release_floor = Duration::from_secs(3);
    let started = std::sync::Arc::new(tokio::sync::Notify::new());
    let handler = handler_fn({
        let started = started.clone();
        move |job: Job| {
            let started = started.clone();
            async move {
                started.notify_one();
                job.cancellation().cancelled().await;
                // The final save a late notice used to skip: the handler
                // was dropped before it could write.
                let mut checkpoint = job.checkpoint().await?;
                checkpoint
                    .save_progress(serde_json::json!({ "segment": 7 }))
                    .await?;
                Err::<(), HandlerError>("stopped for the notice".into())
            }
        }
    });
    let worker = env.worker(config);
    let running = tokio::spawn(worker.run(handler));
    within("the handler to start", started.notified()).await;

    env.emulator
        .schedule(EventSpec::preempt().started())
        .unwrap();
    let report = within("the drain", running).await.unwrap().unwrap();

    assert!(report.drain.met_deadline, "{:?}", report.drain);
    assert!(
        !report.drain.released_running_handlers,
        "it saved and returned before the release"
    );
    assert_eq!((report.stats.released, report.stats.retried), (1, 0));
    assert!(
        report.drain.notice_to_drained < Duration::from_secs(3),
        "released within the floor: {:?}",
        report.drain.notice_to_drained
    );
    let again = env.queue.receive(1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(again.len(), 1, "the message is back on the queue");
    let saved = env
        .checkpoints
        .read(again[0].id.as_str())
        .await
        .unwrap()
        .expect("the final save was kept");
    assert_eq!(
        saved.checkpoint,
        spot_worker::storage::Checkpoint::InProgress {
            progress: serde_json::json!({ "segment": 7 })
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_sent_request_does_not_keep_a_drained_worker_up() {
    let env = Env::start().await;
    let (handler, _handled) = reporting_handler();
    let (worker, health_url) = env.worker_with_health(env.config(VM_A)).await;
    let mut readiness = worker.readiness();
    let stop = worker.shutdown_token();
    let running = tokio::spawn(worker.run(handler));
    within("the gate", readiness.wait_for(|r| r.is_ready()))
        .await
        .unwrap();

    // A client that sends half a request line and then nothing.
    let addr = health_url.trim_start_matches("http://");
    let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut client, b"GET /readyz HT")
        .await
        .unwrap();

    let asked = tokio::time::Instant::now();
    stop.cancel();
    let report = tokio::time::timeout(Duration::from_secs(15), running)
        .await
        .expect("the half-open connection must not hold the worker")
        .unwrap()
        .unwrap();
    let took = asked.elapsed();
    assert_eq!(report.drain.trigger, DrainTrigger::Requested);
    assert!(took < Duration::from_secs(4), "run returned after {took:?}");
    drop(client);
}

/// `SPOT_WORKER_VM_NAME` spares the gate the instance metadata lookup: a
/// server without `/metadata/instance` does not keep the worker idle, and
/// the name is still checked once instance metadata answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_vm_name_opens_the_gate_without_instance_metadata() {
    let env = Env::start().await;
    env.emulator.set_instance_metadata_missing(true);
    env.queue.send("waiting", Duration::ZERO).await.unwrap();
    let mut config = env.config(VM_A);
    config.imds.vm_name = Some("spotvmss_9".to_owned());
    let handled = Handled::default();
    let running = tokio::spawn(env.worker(config).run(handled.handler()));
    within("the message to be handled", handled.wait()).await;
    assert!(
        env.emulator.stats().instance_gets > 0,
        "instance metadata was asked, and did not answer"
    );
    // Instance metadata answers, and contradicts the configured name.
    env.emulator.set_instance_metadata_missing(false);
    let error = within("the worker to refuse", running)
        .await
        .unwrap()
        .expect_err("a contradicted VM name");
    let text = error.to_string();
    assert!(text.contains("SPOT_WORKER_VM_NAME"), "{text}");
    assert!(text.contains("spotvmss_9") && text.contains(VM_A), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_name_that_instance_metadata_contradicts_is_a_clear_error() {
    let env = Env::start().await;
    let mut config = env.config(VM_A);
    config.imds.vm_name = Some("spotvmss_9".to_owned());
    let (handler, _handled) = reporting_handler();
    let error = within("the worker to refuse", env.worker(config).run(handler))
        .await
        .expect_err("a contradicted VM name");
    let text = error.to_string();
    assert!(text.contains("SPOT_WORKER_VM_NAME"), "{text}");
    assert!(text.contains("spotvmss_9"), "{text}");
    assert!(text.contains(VM_A), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_holds_its_approval_until_the_other_worker_on_its_vm_has_drained() {
    let env = Env::start().await;
    env.queue
        .send("slow to stop", Duration::ZERO)
        .await
        .unwrap();
    // Two workers of one VM (one emulator), meeting in one directory.
    let rendezvous = tempfile::tempdir().unwrap();
    let config = || {
        let mut config = env.config(VM_A);
        config.drain.runtime_dir = Some(rendezvous.path().to_owned());
        config
    };
    let started = std::sync::Arc::new(tokio::sync::Notify::new());
    let may_stop = std::sync::Arc::new(tokio::sync::Notify::new());
    // Busy: its handler winds down only when the test lets it.
    let busy_handler = handler_fn({
        let (started, may_stop) = (started.clone(), may_stop.clone());
        move |job: Job| {
            let (started, may_stop) = (started.clone(), may_stop.clone());
            async move {
                started.notify_one();
                job.cancellation().cancelled().await;
                may_stop.notified().await;
                Err::<(), HandlerError>("stopped by the drain".into())
            }
        }
    });
    let busy = env.worker(config());
    let running_busy = tokio::spawn(busy.run(busy_handler));
    within("the busy handler to start", started.notified()).await;
    let idle = env.worker(config());
    let mut idle_readiness = idle.readiness();
    let running_idle = tokio::spawn(idle.run(Handled::default().handler()));
    within(
        "the idle worker to be ready",
        idle_readiness.wait_for(|r| r.is_ready()),
    )
    .await
    .unwrap();

    let event = env.emulator.schedule(EventSpec::preempt()).unwrap();
    // The idle worker drains at once, and holds the approval, saying why.
    let held = within(
        "the idle worker to hold the approval",
        idle_readiness.wait_for(|r| {
            r.shutting_down
                .as_deref()
                .is_some_and(|s| s.contains("other worker(s) on this VM not drained yet"))
        }),
    )
    .await
    .unwrap()
    .clone();
    assert!(!held.is_ready());
    assert!(
        env.emulator.approvals().is_empty(),
        "approved while the busy worker was still draining"
    );
    assert!(!running_idle.is_finished());

    may_stop.notify_one();
    let busy_report = within("the busy worker", running_busy)
        .await
        .unwrap()
        .unwrap();
    let idle_report = within("the idle worker", running_idle)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(busy_report.stats.released, 1, "{busy_report:?}");
    assert!(busy_report.drain.approved_event || idle_report.drain.approved_event);
    let approvals = env.emulator.approvals();
    assert!(!approvals.is_empty());
    assert!(approvals.iter().all(|a| a.event_id == event.id));
    // Both left: their member files are gone.
    let left: Vec<_> = std::fs::read_dir(rendezvous.path())
        .unwrap()
        .flatten()
        .flat_map(|group| std::fs::read_dir(group.path()).unwrap().flatten())
        .map(|member| member.file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
