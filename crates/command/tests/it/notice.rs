//! What a notice saves, for a program written the way most batch programs
//! are: it saves its progress every 16 steps (4 s) with a temporary file
//! renamed over `SPOT_WORKER_CHECKPOINT`, and dies on SIGTERM. Evicted by
//! a real (emulated) IMDS notice 2.5 s after a save, under
//! `spot-worker run --job-key job_id` with default settings, on a real
//! Azurite: the runner's last save stores the 2.5 s-old version, so the
//! work after it is redone by the next VM; the completion record says so,
//! and the fleet's counts record a drain that lost work. The same program
//! saving on SIGTERM loses nothing and is counted as saved at the notice.
//! The program's own log (wall-clock times on this machine) is the measure.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::*;
use spot_worker_command::{CommandConfig, CommandHandler};
use spot_worker_consumer::CompletionRecord;
use spot_worker_imds_emulator::EventSpec;
use spot_worker_storage::FleetLedger;
use spot_worker_testkit::worker::{VM_A, VM_B, within};

/// The program: 48 steps of 0.25 s, a save every 16; with
/// `saves_on_sigterm` it saves its current step on SIGTERM and exits 143,
/// without it it only notes the signal's time in its log and dies of it.
/// After its save on the signal it takes `exit_pause` seconds to exit (an
/// interpreter's teardown, files closed), and notes `exit T` just before.
/// Its log: `exec T` (when the runner started its process: an
/// interpreter takes a while to start, and that is the job's time too),
/// `start STEP T`, `saved STEP T` (after the rename), `term T`, `end STEP
/// T`, with T its wall clock in seconds.
fn program(log: &Path, saves_on_sigterm: bool, exit_pause: f64) -> String {
    format!(
        r#"
import os, signal, sys, time
checkpoint = os.environ["SPOT_WORKER_CHECKPOINT"]
def note(*words):
    with open({log:?}, "a") as f:
        f.write(" ".join(str(w) for w in words) + " " + repr(time.time()) + "\n")
def save(step):
    with open(checkpoint + ".tmp", "w") as f:
        f.write(str(step))
    os.rename(checkpoint + ".tmp", checkpoint)
    note("saved", step)
def executed():
    # The process's start, in clock ticks since boot, on the wall clock.
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
with open({log:?}, "a") as f:
    f.write("exec " + repr(executed()) + "\n")
step = int(open(checkpoint).read()) if os.path.exists(checkpoint) else 0
note("start", step)
def on_term(*_):
    note("term")
    if {saves}:
        save(step)
        time.sleep({exit_pause})
        note("exit")
        sys.exit(143)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
signal.signal(signal.SIGTERM, on_term)
while step < 48:
    time.sleep(0.25)
    step += 1
    if step % 16 == 0 and step < 48:
        save(step)
note("end", step)
"#,
        log = log.display().to_string(),
        saves = if saves_on_sigterm { "True" } else { "False" },
    )
}

/// One line of the program's log: what, the step (if any), and when.
struct Entry {
    what: String,
    step: Option<u64>,
    at: f64,
}

fn entries(log: &Path) -> Vec<Entry> {
    lines(log)
        .iter()
        .map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let at = words.last().unwrap().parse().unwrap();
            let step = (words.len() == 3).then(|| words[1].parse().unwrap());
            Entry {
                what: words[0].to_owned(),
                step,
                at,
            }
        })
        .collect()
}

/// When the program logged `what` (at `step`) the `nth` time (from 0).
fn when(log: &[Entry], what: &str, step: Option<u64>, nth: usize) -> f64 {
    log.iter()
        .filter(|e| e.what == what && (step.is_none() || e.step == step))
        .nth(nth)
        .unwrap_or_else(|| panic!("no {what} {step:?} (#{nth}) in the program's log"))
        .at
}

/// What one eviction of the program left: the finished job's completion
/// record, the fleet's counts, and the program's log.
struct Evicted {
    record: CompletionRecord,
    fleet: spot_worker_decisions::cadence::InterruptionCounts,
    log: Vec<Entry>,
}

/// Runs the job on VM A, evicts A 2.5 s after the program's second save,
/// and lets VM B finish it.
async fn evicted(saves_on_sigterm: bool, exit_pause: f64) -> Evicted {
    let (env, _dir, log) = job_queued(r#"{"job_id":"t1"}"#, "log").await;
    let source = program(&log, saves_on_sigterm, exit_pause);
    // Default settings: the worker's adaptive interval, the stop signal
    // SIGTERM.
    let handler = CommandHandler::new(
        CommandConfig::new("python3", ["-c", source.as_str()]).with_job_key("job_id"),
        env.results.clone(),
    );

    let a = env.worker(env.config(VM_A));
    let running = tokio::spawn(a.run(handler.clone()));
    within("the program's second save", async {
        while !lines(&log).iter().any(|line| line.starts_with("saved 32 ")) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    env.emulator
        .schedule(EventSpec::preempt().resources([VM_A]))
        .unwrap();
    let report = within("worker A to drain", running).await.unwrap().unwrap();
    assert!(report.drain.met_deadline, "{:?}", report.drain);
    assert_eq!((report.stats.released, report.stats.retried), (1, 0));
    // Worker A added its counts to the fleet's as it stopped.
    let fleet = FleetLedger::for_queue(env.checkpoints.clone(), &env.queue_name);
    let after_a = fleet.read().await.unwrap();

    let b = env.worker(env.config(VM_B));
    let stop = b.shutdown_token();
    let running = tokio::spawn(b.run(handler));
    let record = completion_record(&env, "t1").await;
    stop.cancel();
    within("worker B to stop", running).await.unwrap().unwrap();
    env.assert_queues_empty().await;
    let after_b = fleet.read().await.unwrap();
    // B's counts add the finished job, not another interruption.
    assert_eq!(
        (
            after_b.drained,
            after_b.unsaved,
            after_b.late,
            after_b.no_outcome
        ),
        (
            after_a.drained,
            after_a.unsaved,
            after_a.late,
            after_a.no_outcome
        ),
        "{after_b:?}"
    );
    assert_eq!(after_b.job_lengths.jobs(), 1, "{after_b:?}");
    Evicted {
        record,
        fleet: after_a,
        log: entries(&log),
    }
}

/// Within this of what the program's log shows.
const WITHIN: f64 = 0.5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_that_dies_on_sigterm_loses_the_work_since_its_last_save_and_it_is_counted() {
    assert_birth_times_recorded();
    let Evicted { record, fleet, log } = evicted(false, 0.0).await;
    let ledger = record.goodput;
    // What it lost: from its save at step 32 to the signal that killed it.
    let saved = when(&log, "saved", Some(32), 0);
    let lost = when(&log, "term", None, 0) - saved;
    assert!(
        (2.5..6.0).contains(&lost),
        "evicted 2.5 s after the save: {lost}"
    );
    let redone = ledger.redone_ms as f64 / 1000.0;
    assert!(
        (redone - lost).abs() <= WITHIN,
        "redone {redone} s, lost {lost} s: {ledger:?}"
    );
    // Useful: the first VM's work up to the save, all of the second's,
    // each from the process's start.
    let useful = (saved - when(&log, "exec", None, 0))
        + (when(&log, "end", Some(48), 0) - when(&log, "exec", None, 1));
    let reported = ledger.useful_ms as f64 / 1000.0;
    eprintln!(
        "dies on SIGTERM: lost {lost:.3} s, redone {redone:.3} s; useful {reported:.3} s, \
         the program's log {useful:.3} s"
    );
    assert!(
        (reported - useful).abs() <= WITHIN,
        "useful {reported} s, the program's log says {useful} s: {ledger:?}"
    );
    assert_eq!(ledger.deliveries, 2, "{ledger:?}");
    // The second VM resumed from step 32, the version saved 2.5 s before
    // the notice.
    assert!(log.iter().any(|e| e.what == "start" && e.step == Some(32)));
    // One interruption that lost work, with that loss; none saved.
    assert_eq!(
        (fleet.drained, fleet.unsaved, fleet.late, fleet.no_outcome),
        (0, 1, 0, 0),
        "{fleet:?}"
    );
    assert_eq!(fleet.losses, 1, "{fleet:?}");
    assert!(
        (fleet.lost_seconds - redone).abs() < 1e-3,
        "{fleet:?}, redone {redone}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_program_saving_on_sigterm_loses_nothing_and_is_counted_as_saved() {
    assert_birth_times_recorded();
    let Evicted { record, fleet, log } = evicted(true, 0.0).await;
    let ledger = record.goodput;
    // It saved its step at the signal and resumed from there.
    let at_signal = log
        .iter()
        .filter(|e| e.what == "saved")
        .nth(2)
        .and_then(|e| e.step)
        .expect("a save on SIGTERM");
    assert!(at_signal > 32, "saved step {at_signal} on SIGTERM");
    assert!(
        log.iter()
            .any(|e| e.what == "start" && e.step == Some(at_signal))
    );
    assert!(
        ledger.redone_ms <= 300,
        "redone about 0 (the signal's save to the exit): {ledger:?}"
    );
    let useful = (when(&log, "saved", Some(at_signal), 0) - when(&log, "exec", None, 0))
        + (when(&log, "end", Some(48), 0) - when(&log, "exec", None, 1));
    let reported = ledger.useful_ms as f64 / 1000.0;
    eprintln!(
        "saves on SIGTERM: redone {:.3} s; useful {reported:.3} s, the program's log {useful:.3} s",
        ledger.redone_ms as f64 / 1000.0
    );
    assert!(
        (reported - useful).abs() <= WITHIN,
        "useful {reported} s, the program's log says {useful} s: {ledger:?}"
    );
    assert_eq!(
        (fleet.drained, fleet.unsaved, fleet.late, fleet.no_outcome),
        (1, 0, 0, 0),
        "{fleet:?}"
    );
    assert_eq!(fleet.losses, 0, "{fleet:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_programs_exit_after_its_save_on_the_signal_is_not_charged_as_redone() {
    assert_birth_times_recorded();
    // Saves on SIGTERM, then takes 0.4 s to exit: that time is no work
    // any next delivery does again.
    let Evicted { record, log, .. } = evicted(true, 0.4).await;
    let ledger = record.goodput;
    let exit_took = when(&log, "exit", None, 0) - when(&log, "term", None, 0);
    assert!(exit_took >= 0.4, "the program's exit took {exit_took} s");
    assert!(
        ledger.redone_ms <= 200,
        "redone about 0, not the program's {exit_took:.3} s to exit: {ledger:?}"
    );
    // Its exit is the job's time on that VM, kept with the save.
    let useful = (when(&log, "exit", None, 0) - when(&log, "exec", None, 0))
        + (when(&log, "end", Some(48), 0) - when(&log, "exec", None, 1));
    let reported = ledger.useful_ms as f64 / 1000.0;
    assert!(
        (reported - useful).abs() <= WITHIN,
        "useful {reported} s, the program's log says {useful} s: {ledger:?}"
    );
}
