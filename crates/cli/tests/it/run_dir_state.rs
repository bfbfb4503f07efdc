//! A checkpoint directory saved as one state of the program, under the real
//! `spot-worker run` on Azurite with the IMDS emulator: `dir_state/steps.py`
//! updates two files per step (a.txt = N, then b.txt = N), without pause
//! until the test calms it, so the runner's reads find the directory
//! changing.
//!
//! - Without a commit marker, its runner SIGKILLed: a read that found the
//!   directory changing is tried again promptly, so the state the program
//!   holds once calm is saved (not an interval later), and the next VM's
//!   runner restores a state the program was in.
//! - With a commit marker (`SPOT_WORKER_CHECKPOINT_MARKER`), evicted by a
//!   Preempt notice after the program began a step it never ended: only
//!   the state at a marker is saved, so the next VM's runner restores
//!   a = b = COMMIT, never the half step on disk at the notice.

use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use spot_worker_imds_emulator::EventSpec;
use spot_worker_storage::files::manifest::{Content, Files};
use support::PATIENCE;
use support::large::{Runner, World, python};

/// The job every test runs.
const JOB: &str = "steps";

/// What the runner logs when a read found the directory changing.
const CHANGED: &str = "the checkpoint changed while it was read";

/// A fixed interval far longer than the tests wait: a save that is not
/// retried promptly is not made while they run.
const LONG_INTERVAL: &str = "300s";

fn script() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/dir_state/steps.py")
        .display()
        .to_string()
}

/// The program's directories and log, and its environment.
struct Program {
    go: PathBuf,
    log: PathBuf,
    env: Vec<(&'static str, String)>,
}

impl Program {
    fn new(world: &World, marker: bool) -> Program {
        let go = world.go_dir("go");
        let log = world.path("steps.log");
        let env = vec![
            ("STEPS_GO", go.display().to_string()),
            ("STEPS_LOG", log.display().to_string()),
            ("STEPS_MARKER", if marker { "1" } else { "0" }.to_owned()),
            // 8 MiB: a read of the directory takes tens of milliseconds
            // (chunked, hashed and sent), the program's step far less.
            ("STEPS_BALLAST", (8 << 20).to_string()),
        ];
        Program { go, log, env }
    }

    fn go(&self, name: &str) {
        std::fs::write(self.go.join(name), b"").unwrap();
    }

    /// The first line of its log starting with `word`, waited for.
    async fn said(&self, word: &str, runner: &Runner) -> Vec<String> {
        let started = std::time::Instant::now();
        loop {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            if let Some(line) = text.lines().find(|line| line.starts_with(word)) {
                return line.split(' ').skip(1).map(str::to_owned).collect();
            }
            assert!(
                started.elapsed() < PATIENCE,
                "the program did not say {word:?}:\n{}",
                runner.log.text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn runner(
        &self,
        world: &World,
        vm: &spot_worker_imds_emulator::RunningEmulator,
        flags: &[&str],
    ) -> Runner {
        let (python, script) = (python(), script());
        world.runner_of(
            vm,
            flags,
            &[python.as_str(), script.as_str()],
            &self.env,
            &[("SPOT_WORKER_VISIBILITY_TIMEOUT", "5s")],
        )
    }
}

/// The files of the job's saved checkpoint directory, by name, if any.
async fn saved(world: &World) -> Option<BTreeMap<String, String>> {
    let Files::Listed(files) = world.manifest(JOB).await?.files else {
        return None;
    };
    Some(
        files
            .into_iter()
            .filter_map(|file| {
                let name = file.path.strip_prefix("dir/")?.to_owned();
                match file.content {
                    Content::Inline(bytes) => Some((name, String::from_utf8(bytes).ok()?)),
                    _ => None,
                }
            })
            .collect(),
    )
}

/// Waits (bounded) until the saved directory passes `done`.
async fn until_saved(
    world: &World,
    runner: &Runner,
    what: &str,
    done: impl Fn(&BTreeMap<String, String>) -> bool,
) -> BTreeMap<String, String> {
    let started = std::time::Instant::now();
    loop {
        if let Some(files) = saved(world).await
            && done(&files)
        {
            return files;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "not saved: {what} (saved: {:?}):\n{}",
            saved(world).await,
            runner.log.text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `(a, b)` is a state the program was in (`steps.py`): neither
/// file (the ballast alone), a = 1 alone, or a = b = N, or a = N + 1 with
/// b = N.
fn was_a_state(a: &str, b: &str) -> bool {
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Err(_), Err(_)) => a == "-" && b == "-",
        (Ok(1), Err(_)) => b == "-",
        (Ok(a), Ok(b)) => b >= 1 && (a == b || a == b + 1),
        _ => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_always_written_is_saved_promptly_once_it_holds_still_and_restores_a_state() {
    let world = World::start().await;
    world.send(JOB).await;
    let program = Program::new(&world, false);
    let mut a = program.runner(
        &world,
        &world.emulator,
        &["--checkpoint-every", LONG_INTERVAL],
    );
    // The program steps without pause: the runner's reads find its files
    // changing (or, on a machine that stalls the program for a whole read,
    // one holds still and is saved: a state all the same).
    let started = std::time::Instant::now();
    while a.log.line(&[CHANGED]).is_none() && saved(&world).await.is_none() {
        assert!(started.elapsed() < PATIENCE, "no read:\n{}", a.log.text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let changed_first = saved(&world).await.is_none();
    program.go("calm");
    let calm = program.said("calm", &a).await.remove(0);
    if changed_first {
        // Tried again within seconds, not at the next look 300 s later.
        until_saved(&world, &a, "the calm state", |files| {
            files.get("a.txt") == Some(&calm) && files.get("b.txt") == Some(&calm)
        })
        .await;
    }
    let kept = saved(&world).await.expect("a version was saved");
    // The OOM killer, or `kill -9`: no final save.
    a.signal(libc::SIGKILL);
    a.exit().await;
    let mut b = program.runner(
        &world,
        &world.other_vm,
        &["--checkpoint-every", LONG_INTERVAL],
    );
    let restored = program.said("restored", &b).await;
    b.signal(libc::SIGTERM);
    assert_eq!(b.exit().await, Some(0), "{}", b.log.text());
    assert!(
        was_a_state(&restored[0], &restored[1]),
        "restored a = {}, b = {}: not a state of the program",
        restored[0],
        restored[1]
    );
    let missing = "-".to_owned();
    assert_eq!(
        (&restored[0], &restored[1]),
        (
            kept.get("a.txt").unwrap_or(&missing),
            kept.get("b.txt").unwrap_or(&missing)
        ),
        "restored what was saved"
    );
    if changed_first {
        assert_eq!((&restored[0], &restored[1]), (&calm, &calm));
    }
    eprintln!(
        "read found it changing first: {changed_first}; calm at step {calm}; restored {restored:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_commit_marker_only_the_state_at_the_marker_is_saved_even_at_a_notice() {
    let world = World::start().await;
    world.send(JOB).await;
    let program = Program::new(&world, true);
    let flags = [
        "--checkpoint-every",
        LONG_INTERVAL,
        "--checkpoint-marker",
        "COMMIT",
    ];
    let mut a = program.runner(&world, &world.emulator, &flags);
    a.log
        .wait_for(&["saving the checkpoint beside the program"])
        .await;
    program.go("calm");
    let calm = program.said("calm", &a).await.remove(0);
    // A committed state is saved: the calm one, or one a read caught at
    // its marker while the program stepped.
    until_saved(&world, &a, "a committed state", |files| {
        files.contains_key("COMMIT")
    })
    .await;
    // A step begun and never ended: on disk at the notice, not committed.
    program.go("after");
    program.said("after", &a).await;
    world.emulator.schedule(EventSpec::preempt()).unwrap();
    assert_eq!(a.exit().await, Some(0), "{}", a.log.text());
    let mut b = program.runner(&world, &world.other_vm, &flags);
    let restored = program.said("restored", &b).await;
    b.signal(libc::SIGTERM);
    assert_eq!(b.exit().await, Some(0), "{}", b.log.text());
    assert!(
        restored[0] == restored[1] && restored[1] == restored[2] && restored[0] != "-",
        "restored a = {}, b = {}, COMMIT = {}: not a committed state:\n{}",
        restored[0],
        restored[1],
        restored[2],
        a.log.text()
    );
    assert!(
        restored[0].parse::<u64>().unwrap() <= calm.parse::<u64>().unwrap(),
        "restored step {} after the calm step {calm}",
        restored[0]
    );
    eprintln!("calm at step {calm}; restored {restored:?}");
}
