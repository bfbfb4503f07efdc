//! `spot-worker run -- PROGRAM`, the real binary on a real Azurite with the
//! IMDS emulator: a program does its job with the contract's environment
//! and no credential of the runner's, and SIGTERM drains the worker to
//! exit 0.

use std::process::Stdio;
use std::time::Duration;

use spot_worker_azure::{AzureStorage, StorageConfig};
use spot_worker_imds_emulator::RunningEmulator;
use spot_worker_storage::{MessageQueue as _, ResultStore as _};
use spot_worker_testkit::Azurite;
use tokio::process::Command;

/// `spot-worker run` with `args`, as `nobody` when the test runs as root.
fn spot_worker_run(args: &[&str], connection_string: &str, imds: &str) -> Command {
    // SAFETY: geteuid has no arguments and cannot fail.
    let mut command = if unsafe { libc::geteuid() } == 0 {
        let mut command = Command::new("setpriv");
        command.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]);
        command.arg(env!("CARGO_BIN_EXE_spot-worker"));
        command
    } else {
        Command::new(env!("CARGO_BIN_EXE_spot-worker"))
    };
    command.arg("run").args(args);
    with_worker_env(&mut command, connection_string, imds);
    command
}

/// The environment of a worker on Azurite (`connection_string`) and the
/// emulator (`imds`): the queue `jobs`, a free health port, nothing from
/// the test's own environment that would change it; stderr piped, killed
/// when dropped.
fn with_worker_env<'a>(
    command: &'a mut Command,
    connection_string: &str,
    imds: &str,
) -> &'a mut Command {
    command
        .env("AZURE_STORAGE_CONNECTION_STRING", connection_string)
        .env("SPOT_WORKER_IMDS_ENDPOINT", imds)
        .env("SPOT_WORKER_HEALTH_ADDR", "127.0.0.1:0")
        .env("SPOT_WORKER_QUEUE", "jobs")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("RUST_LOG")
        .env_remove("SPOT_WORKER_CONFIG")
        .env_remove("SPOT_WORKER_STORAGE_ACCOUNT_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
}

/// Bound on every wait.
const PATIENCE: Duration = Duration::from_secs(90);

/// Azurite with the queue `jobs`, and the IMDS emulator.
struct World {
    azurite: Azurite,
    emulator: RunningEmulator,
    storage: AzureStorage,
    queue: spot_worker_azure::AzureQueue,
}

impl World {
    async fn start() -> World {
        let azurite = crate::support::azurite_from(Azurite::start).await;
        let emulator = crate::support::imds_of("spotvmss_0").await;
        let config = StorageConfig::from_connection_string(&azurite.connection_string()).unwrap();
        let storage = AzureStorage::new(config).unwrap();
        let queue = storage.queue("jobs").unwrap();
        queue.prepare().await.unwrap();
        World {
            azurite,
            emulator,
            storage,
            queue,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_gets_its_job_but_never_the_runners_credentials() {
    let world = World::start().await;
    let (connection_string, storage, queue, emulator) = (
        world.azurite.connection_string(),
        &world.storage,
        &world.queue,
        &world.emulator,
    );
    queue
        .send(r#"{"job_id":"s1"}"#, Duration::ZERO)
        .await
        .unwrap();
    // The worker's settings also in a file, as a deployment may give them.
    let dir = tempfile::tempdir().unwrap();
    let config_file = dir.path().join("worker.toml");
    std::fs::write(
        &config_file,
        format!("azure_storage_connection_string = {connection_string:?}\n"),
    )
    .unwrap();
    set_mode(dir.path(), 0o755);
    set_mode(&config_file, 0o644);
    // Everything the program can see of itself and of its parent, the
    // runner (its environment, its command line, the settings file it was
    // given), becomes its result.
    let program = r#"{ env; echo ---; tr '\0' '\n' < /proc/$PPID/environ; echo "read=$?";
        echo ---; tr '\0' ' ' < /proc/$PPID/cmdline; echo "cmdline=$?";
        echo ---; cat "${SPOT_WORKER_CONFIG:-/no-config-variable}"; echo "config=$?";
        } > "$SPOT_WORKER_RESULT" 2>&1"#;
    // Root reads every process's memory whatever the runner does; the
    // promise is for a runner that is not root (the systemd unit and the
    // container image run it as a user of its own), so a root test runs the
    // worker as `nobody` (util-linux's setpriv).
    let worker = spot_worker_run(
        &[
            "--job-key",
            "job_id",
            "--pass-env",
            "MY_API_TOKEN",
            "--",
            "sh",
            "-c",
            program,
        ],
        &connection_string,
        &emulator.url(),
    )
    .env("SPOT_WORKER_CONFIG", &config_file)
    .env("MY_API_TOKEN", "passed-on-purpose")
    .env("OTHER_TOKEN", "not-for-programs")
    // Telemetry exporters' keys, per signal, and credentials by their
    // value alone.
    .env(
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        "x-tenant=per-signal-key",
    )
    .env("UPSTREAM", "Authorization=Basic dXNlcjpwYXNzd29yZA==")
    .env("EXPORT", "x-team=a,api-key=exporter-key")
    .spawn()
    .unwrap();

    let results = storage.result_store("results").unwrap();
    let mut result = None;
    let started = std::time::Instant::now();
    while started.elapsed() < PATIENCE {
        if let Some(bytes) = results.get("s1").await.unwrap_or(None) {
            result = Some(String::from_utf8(bytes).unwrap());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pid = worker.id().unwrap() as i32;
    // SAFETY: signals the worker this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let output = tokio::time::timeout(PATIENCE, worker.wait_with_output())
        .await
        .expect("the worker exits after SIGTERM")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let result = result.unwrap_or_else(|| panic!("no result; the worker said: {stderr}"));

    assert!(result.contains("SPOT_WORKER_JOB_KEY=s1"), "{result}");
    assert!(
        result.contains("MY_API_TOKEN=passed-on-purpose"),
        "{result}"
    );
    let key = connection_string
        .split(';')
        .find_map(|part| part.strip_prefix("AccountKey="))
        .expect("Azurite's connection string has a key");
    assert!(
        result.contains("run --job-key job_id --pass-env MY_API_TOKEN -- sh -c")
            && result.contains("cmdline=0"),
        "the runner's command line is readable, and holds no credential:\n{result}"
    );
    for secret in [
        key,
        "AZURE_STORAGE_CONNECTION_STRING",
        "azure_storage_connection_string",
        // (the program's text, in the command line, names the variable)
        "SPOT_WORKER_CONFIG=",
        "not-for-programs",
        "per-signal-key",
        "dXNlcjpwYXNzd29yZA==",
        "exporter-key",
    ] {
        assert!(
            !result.contains(secret),
            "the program saw {secret}:\n{result}"
        );
    }
    assert!(
        !result.contains("read=0"),
        "the runner's environment was readable:\n{result}"
    );
    assert!(
        !result.contains("config=0"),
        "the program found the settings file:\n{result}"
    );
}

/// Sets `path`'s mode: the worker may run as `nobody` (see `spot_worker_run`).
fn set_mode(path: &std::path::Path, mode: u32) {
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_given_as_a_flag_is_refused_with_the_way_to_give_it() {
    let world = World::start().await;
    let connection_string = world.azurite.connection_string();
    world
        .queue
        .send(r#"{"job_id":"untouched"}"#, Duration::ZERO)
        .await
        .unwrap();
    let key = connection_string
        .split(';')
        .find_map(|part| part.strip_prefix("AccountKey="))
        .expect("Azurite's connection string has a key");
    let stderr = refused_at_once(
        &world,
        spot_worker_run(
            &[
                "--azure-storage-connection-string",
                &connection_string,
                "--",
                "true",
            ],
            &connection_string,
            &world.emulator.url(),
        )
        .env_remove("AZURE_STORAGE_CONNECTION_STRING"),
    )
    .await;
    assert!(
        stderr.contains("--azure-storage-connection-string")
            && stderr.contains("set AZURE_STORAGE_CONNECTION_STRING in the worker's environment")
            && stderr.contains("managed identity"),
        "{stderr}"
    );
    assert!(!stderr.contains(key), "the error echoes the key: {stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_ignoring_sigterm_still_lets_the_worker_exit_0_within_the_drain_budget() {
    let world = World::start().await;
    let (connection_string, queue, emulator) = (
        world.azurite.connection_string(),
        &world.queue,
        &world.emulator,
    );
    queue.send("stubborn", Duration::ZERO).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Readable and writable by the worker when it runs as nobody.
    set_mode(dir.path(), 0o777);
    let started = dir.path().join("started");
    let program = format!(
        "trap '' TERM; touch '{}'; while :; do sleep 0.1; done",
        started.display()
    );
    let worker = spot_worker_run(
        &[
            "--drain-budget",
            "4s",
            "--release-margin",
            "2s",
            "--",
            "sh",
            "-c",
            &program,
        ],
        &connection_string,
        &emulator.url(),
    )
    .spawn()
    .unwrap();
    let waited = std::time::Instant::now();
    while !started.exists() && waited.elapsed() < PATIENCE {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(started.exists(), "the program started");
    let pid = worker.id().unwrap() as i32;
    let sent = std::time::Instant::now();
    // SAFETY: signals the worker this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let output = tokio::time::timeout(PATIENCE, worker.wait_with_output())
        .await
        .expect("the worker exits after SIGTERM")
        .unwrap();
    let took = sent.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        took < Duration::from_secs(4),
        "exited {took:?} after SIGTERM; budget 4 s"
    );
    let again = queue.receive(1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(again.len(), 1, "the message was released");
    assert_eq!(again[0].body, "stubborn");
}

/// `command` (a `spot-worker run`) exits 1 at once and takes nothing from
/// `world`'s queue (its one message waits there still): what it said.
async fn refused_at_once(world: &World, command: &mut Command) -> String {
    let output = tokio::time::timeout(PATIENCE, command.output())
        .await
        .expect("the runner exits at once")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let waiting = world
        .queue
        .receive(1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(waiting.len(), 1, "nothing was taken");
    stderr
}

/// Whether `pid` is a process that still runs (a zombie has stopped).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let (_, rest) = stat.rsplit_once(')')?;
            rest.split_whitespace().next().map(str::to_owned)
        })
        .is_some_and(|state| state != "Z" && state != "X")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_killed_with_sigkill_takes_its_program_with_it_and_the_next_cleans_up() {
    let world = World::start().await;
    let (connection_string, queue, emulator) = (
        world.azurite.connection_string(),
        &world.queue,
        &world.emulator,
    );
    queue.send("long", Duration::ZERO).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Writable by the worker when it runs as nobody.
    set_mode(dir.path(), 0o777);
    let (pid_file, child_file) = (dir.path().join("program"), dir.path().join("child"));
    // A child of its own first (it has no parent-death signal), then the
    // program's long computation.
    let program = format!(
        "sleep 600 & echo $! > '{child}.tmp'; mv '{child}.tmp' '{child}'; \
         echo $$ > '{pid}.tmp'; mv '{pid}.tmp' '{pid}'; exec sleep 600",
        pid = pid_file.display(),
        child = child_file.display()
    );
    let mut worker = spot_worker_run(
        &["--", "sh", "-c", &program],
        &connection_string,
        &emulator.url(),
    )
    .spawn()
    .unwrap();
    let waited = std::time::Instant::now();
    while !pid_file.exists() && waited.elapsed() < PATIENCE {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let program_pid: i32 = std::fs::read_to_string(&pid_file)
        .expect("the program started")
        .trim()
        .parse()
        .unwrap();
    assert!(running(program_pid), "the program runs");

    // The OOM killer, or `kill -9`: the runner has no chance to clean up.
    worker.start_kill().unwrap();
    tokio::time::timeout(PATIENCE, worker.wait())
        .await
        .expect("SIGKILL ends the runner")
        .unwrap();
    let killed = std::time::Instant::now();
    let bound = Duration::from_secs(10);
    while running(program_pid) && killed.elapsed() < bound {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !running(program_pid),
        "the program {program_pid} still runs {:?} after its runner was killed",
        killed.elapsed()
    );

    // What the program started itself is the next runner's to clean up.
    let child_pid: i32 = std::fs::read_to_string(&child_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        running(child_pid),
        "a child of the program has no such signal"
    );
    let next = spot_worker_run(
        &["--", "sh", "-c", "exit 0"],
        &connection_string,
        &emulator.url(),
    )
    .spawn()
    .unwrap();
    let started = std::time::Instant::now();
    while running(child_pid) && started.elapsed() < PATIENCE {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !running(child_pid),
        "the program's child {child_pid} still runs after the next runner started"
    );
    drop(next);
}

/// Whether the test runs as root; if not, says on stderr that it is
/// skipped and why (CI runs as root).
fn root_or_say_why(why: &str) -> bool {
    // SAFETY: geteuid has no arguments and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipped: {why}; CI runs as root, run it there");
    }
    root
}

/// Where a runner of [`runners_in_separate_pid_namespaces_never_touch_each_others_work`]
/// runs.
#[derive(Clone, Copy, Debug)]
enum PidNamespace {
    /// The test's own.
    Host,
    /// One of its own, with a `/proc` of its own (`unshare --pid --fork
    /// --mount-proc`): what a container gets.
    Own,
    /// One of its own, seeing the host's `/proc` (`unshare --pid --fork`).
    OwnWithHostProc,
}

/// `spot-worker run -- sh -c program` as root in `namespace`, with its
/// delivery directories under `work_root`; its stderr piped.
fn runner_in(
    namespace: PidNamespace,
    work_root: &std::path::Path,
    program: &str,
    world: &World,
) -> tokio::process::Child {
    let binary = env!("CARGO_BIN_EXE_spot-worker");
    let mut command = match namespace {
        PidNamespace::Host => Command::new(binary),
        PidNamespace::Own | PidNamespace::OwnWithHostProc => {
            let mut command = Command::new("unshare");
            command.args(["--pid", "--fork", "--kill-child"]);
            if matches!(namespace, PidNamespace::Own) {
                command.arg("--mount-proc");
            }
            command.arg("--").arg(binary);
            command
        }
    };
    command.args(["run", "--", "sh", "-c", program]);
    with_worker_env(
        &mut command,
        &world.azurite.connection_string(),
        &world.emulator.url(),
    )
    .env("SPOT_WORKER_CONCURRENCY", "1")
    .env("TMPDIR", work_root)
    .spawn()
    .expect("the runner starts")
}

/// Reads `child`'s stderr until a line contains `text` (bounded); every
/// line read so far.
async fn read_until(child: &mut tokio::process::Child, text: &str) -> String {
    use tokio::io::AsyncBufReadExt as _;
    let stderr = child.stderr.take().expect("stderr is piped");
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let mut seen = String::new();
    let found = tokio::time::timeout(PATIENCE, async {
        while let Ok(Some(line)) = lines.next_line().await {
            seen.push_str(&line);
            seen.push('\n');
            if line.contains(text) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(found, Ok(true), "no line with {text:?}:\n{seen}");
    // Keep reading, so that the runner never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    seen
}

/// The delivery directories under `work_root` whose program has started
/// (it leaves `started` in its work directory), with the host pid of the
/// program found by its `SPOT_WORKER_WORK_DIR`.
fn started_programs(work_root: &std::path::Path) -> Vec<(std::path::PathBuf, i32)> {
    let Ok(entries) = std::fs::read_dir(work_root) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|entry| entry.path())
        .filter(|dir| dir.join("work/started").exists())
        .filter_map(|dir| {
            let marker = format!("SPOT_WORKER_WORK_DIR={}", dir.join("work").display());
            let pid = std::fs::read_dir("/proc")
                .ok()?
                .flatten()
                .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
                .find(|pid| {
                    std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|environ| {
                        environ
                            .split(|&b| b == 0)
                            .any(|var| var == marker.as_bytes())
                    }) && running(*pid)
                })?;
            Some((dir, pid))
        })
        .collect::<std::collections::BTreeMap<_, _>>()
        .into_iter()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runners_in_separate_pid_namespaces_never_touch_each_others_work() {
    if !root_or_say_why("PID namespaces (unshare --pid) need root") {
        return;
    }
    let world = World::start().await;
    for job in ["one", "two"] {
        world.queue.send(job, Duration::ZERO).await.unwrap();
    }
    // One work root for every runner, as containers sharing a host's /tmp
    // (or a volume) have.
    let work_root = tempfile::tempdir().unwrap();
    let program =
        r#"echo "$SPOT_WORKER_MESSAGE_ID" > "$SPOT_WORKER_WORK_DIR/started"; exec sleep 600"#;
    // Waits for `count` programs to run, while those of `kept` stay.
    let wait_for_programs = |count: usize, kept: Vec<(std::path::PathBuf, i32)>| {
        let work_root = work_root.path().to_owned();
        async move {
            let since = std::time::Instant::now();
            loop {
                for (dir, pid) in &kept {
                    assert!(
                        dir.join("runner").exists() && running(*pid),
                        "the live job of {} was swept away (directory there: {}, program \
                         running: {}) by another namespace's runner starting",
                        dir.display(),
                        dir.exists(),
                        running(*pid)
                    );
                }
                let started = started_programs(&work_root);
                if started.len() >= count {
                    return started;
                }
                assert!(
                    since.elapsed() < PATIENCE,
                    "{count} program(s) did not start"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };

    // Two runners, each in a PID namespace of its own (each is pid 1
    // there), each running one job.
    let _a = runner_in(PidNamespace::Own, work_root.path(), program, &world);
    let first = wait_for_programs(1, Vec::new()).await;
    let _b = runner_in(PidNamespace::Own, work_root.path(), program, &world);
    let before = wait_for_programs(2, first).await;
    assert_eq!(before.len(), 2, "{before:?}");

    // A third on the host, and a fourth in a namespace that sees the
    // host's /proc: each sweeps for leftovers as it starts, before its
    // warmup gate opens.
    let mut host = runner_in(PidNamespace::Host, work_root.path(), program, &world);
    let host_log = read_until(&mut host, "warmup gate open").await;
    let mut blind = runner_in(
        PidNamespace::OwnWithHostProc,
        work_root.path(),
        program,
        &world,
    );
    let blind_log = read_until(&mut blind, "warmup gate open").await;

    let after = started_programs(work_root.path());
    for (dir, pid) in &before {
        assert!(
            dir.join("runner").exists() && dir.join("work/started").exists(),
            "{} was swept away under its live runner",
            dir.display()
        );
        assert!(
            running(*pid),
            "the program {pid} of {} was killed",
            dir.display()
        );
    }
    assert_eq!(after, before, "both jobs run on, untouched");
    // Each said why it touched nothing.
    assert!(
        host_log.contains("left alone delivery directories of runners of another PID namespace")
            && host_log.contains("directories=2"),
        "{host_log}"
    );
    assert!(
        blind_log.contains("looked for no leftovers of a killed runner")
            && blind_log.contains("another PID namespace than this runner's"),
        "{blind_log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_of_a_runner_started_from_nohup_inherits_only_stdio_and_default_signals() {
    let world = World::start().await;
    world.queue.send("inherit", Duration::ZERO).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let findings = dir.path().join("findings");
    // What the program sees of itself: the signals it ignores (a bit mask,
    // /proc/self/status) and its open descriptors (those still open after
    // the glob's own directory descriptor is closed).
    let program = r#"fds=""; for f in /proc/$$/fd/*; do [ -e "$f" ] && fds="$fds ${f##*/}"; done
        while read -r key value; do [ "$key" = SigIgn: ] && ignored=$value; done < /proc/$$/status
        printf 'ignored=%s\nfds=%s\n' "$ignored" "$fds" > "$FINDINGS.tmp"; mv "$FINDINGS.tmp" "$FINDINGS"
        exec sleep 600"#;
    // The runner started as an operator's shell would: SIGQUIT ignored by a
    // trap, two files left open, then `nohup` (SIGHUP ignored).
    let mut nohup = Command::new("sh");
    nohup.args([
        "-c",
        r#"trap '' QUIT; exec 7</dev/null 9>>"$FINDINGS.leak"; exec nohup "$@""#,
        "sh",
        env!("CARGO_BIN_EXE_spot-worker"),
        "run",
        "--stop-signal",
        "SIGHUP",
        "--",
        "sh",
        "-c",
        program,
    ]);
    let mut runner = with_worker_env(
        &mut nohup,
        &world.azurite.connection_string(),
        &world.emulator.url(),
    )
    .env("FINDINGS", &findings)
    .spawn()
    .unwrap();
    let waited = std::time::Instant::now();
    while !findings.exists() && waited.elapsed() < PATIENCE {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen = std::fs::read_to_string(&findings).expect("the program ran");
    assert!(
        seen.contains("ignored=0000000000000000\n"),
        "the program ignores signals its runner's parent ignored (SIGHUP 0x1, SIGQUIT 0x4):\n{seen}"
    );
    assert!(
        seen.contains("fds= 0 1 2\n"),
        "the program inherited descriptors beyond stdin, stdout and stderr:\n{seen}"
    );

    // So `--stop-signal SIGHUP` stops it: at once, not with the SIGKILL
    // at the release time.
    let pid = runner.id().unwrap() as i32;
    // SAFETY: signals the runner this test started (`exec` kept its pid).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let ended = read_until(&mut runner, "the program ended").await;
    let ended = ended.lines().last().unwrap_or_default();
    assert!(ended.contains("was killed by SIGHUP"), "{ended}");
    let status = tokio::time::timeout(PATIENCE, runner.wait())
        .await
        .expect("the runner exits after SIGTERM")
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_run_as_another_user_cannot_read_the_runners_settings_file() {
    if !root_or_say_why("switching users takes a runner with root's powers") {
        return;
    }
    let world = World::start().await;
    world
        .queue
        .send(r#"{"job_id":"separated"}"#, Duration::ZERO)
        .await
        .unwrap();
    // The runner's credentials in its settings file alone, readable by the
    // runner's user only, in a directory anyone may look into.
    let dir = tempfile::tempdir().unwrap();
    set_mode(dir.path(), 0o755);
    let config_file = dir.path().join("worker.toml");
    std::fs::write(
        &config_file,
        format!(
            "azure_storage_connection_string = {:?}\n",
            world.azurite.connection_string()
        ),
    )
    .unwrap();
    set_mode(&config_file, 0o600);
    // The program is not told the path, but a path is easy to guess: here
    // it is told, under a name that is no credential's.
    let program = r#"{ echo "uid=$(id -u) gid=$(id -g) user=$USER home=$HOME"
        cat "$GUESSED"; echo "config=$?"
        tr '\0' '\n' < /proc/$PPID/environ; echo "environ=$?"
        grep -E '^Cap(Prm|Eff|Amb):' /proc/self/status
        echo 7 > "$SPOT_WORKER_CHECKPOINT.tmp" && mv "$SPOT_WORKER_CHECKPOINT.tmp" "$SPOT_WORKER_CHECKPOINT"
        echo "checkpoint=$?"
        touch "$SPOT_WORKER_WORK_DIR/scratch"; echo "work=$?"
        } > "$SPOT_WORKER_RESULT" 2>&1"#;
    let mut separated = Command::new(env!("CARGO_BIN_EXE_spot-worker"));
    separated.args([
        "run",
        "--job-key",
        "job_id",
        "--program-user",
        "nobody",
        "--",
        "sh",
        "-c",
        program,
    ]);
    let mut runner = with_worker_env(&mut separated, "", &world.emulator.url())
        // The connection string is in the settings file alone.
        .env_remove("AZURE_STORAGE_CONNECTION_STRING")
        .env("SPOT_WORKER_CONFIG", &config_file)
        .env("GUESSED", &config_file)
        .spawn()
        .unwrap();
    let results = world.storage.result_store("results").unwrap();
    let started = std::time::Instant::now();
    let result = loop {
        if let Some(bytes) = results.get("separated").await.unwrap_or(None) {
            break String::from_utf8(bytes).unwrap();
        }
        if let Ok(Some(status)) = runner.try_wait() {
            let log = read_until(&mut runner, "").await;
            panic!("the runner exited ({status}) without a result:\n{log}");
        }
        assert!(started.elapsed() < PATIENCE, "no result");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let pid = runner.id().unwrap() as i32;
    // SAFETY: signals the runner this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::time::timeout(PATIENCE, runner.wait())
        .await
        .expect("the runner exits after SIGTERM")
        .unwrap();
    assert_eq!(status.code(), Some(0));

    let key = world
        .azurite
        .connection_string()
        .split(';')
        .find_map(|part| part.strip_prefix("AccountKey=").map(str::to_owned))
        .unwrap();
    assert!(
        !result.contains(&key),
        "the program read the key:\n{result}"
    );
    for expected in [
        "uid=65534 gid=65534 user=nobody home=/nonexistent",
        "Permission denied",
        "config=1",
        "/environ: Permission denied",
        "CapPrm:\t0000000000000000",
        "CapEff:\t0000000000000000",
        "CapAmb:\t0000000000000000",
        "checkpoint=0",
        "work=0",
    ] {
        assert!(result.contains(expected), "no {expected:?} in:\n{result}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_that_cannot_switch_users_refuses_to_start_with_a_program_user() {
    let world = World::start().await;
    world.queue.send("untouched", Duration::ZERO).await.unwrap();
    // As nobody (when the test is root) or as the test's own user: no
    // capability either way.
    let stderr = refused_at_once(
        &world,
        &mut spot_worker_run(
            &["--program-user", "4242", "--", "true"],
            &world.azurite.connection_string(),
            &world.emulator.url(),
        ),
    )
    .await;
    assert!(
        stderr.contains("SPOT_WORKER_PROGRAM_USER 4242")
            && stderr.contains("needs the runner to have CAP_SETUID, CAP_SETGID"),
        "{stderr}"
    );
}

/// A program keeping its state in a live SQLite database (Python's stdlib
/// `sqlite3`, rollback-journal mode, a commit every 0.25 s, no SIGTERM
/// handler), under `spot-worker run` with default (adaptive) settings: its
/// runner is SIGKILLed with it after 20 s. The next runner resumes it from
/// a database that passes `PRAGMA integrity_check`, whose rows are a
/// prefix of what it wrote, losing at most one interval's rows. The
/// program checks its database itself as it starts; its log (wall-clock
/// times) is the measure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_database_killed_with_its_runner_resumes_consistent_within_an_interval() {
    let world = World::start().await;
    let (connection_string, queue, emulator) = (
        world.azurite.connection_string(),
        &world.queue,
        &world.emulator,
    );
    queue.send("db", Duration::ZERO).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Writable by the worker when it runs as nobody.
    set_mode(dir.path(), 0o777);
    let log = dir.path().join("log");
    let program = r#"
import os, sqlite3, sys, time
log = sys.argv[1]
def note(*words):
    with open(log, "a") as f:
        f.write(" ".join(str(w) for w in words) + " " + repr(time.time()) + "\n")
path = os.path.join(os.environ["SPOT_WORKER_CHECKPOINT_DIR"], "rows.db")
db = sqlite3.connect(path, timeout=30)
db.execute("CREATE TABLE IF NOT EXISTS t (n INTEGER PRIMARY KEY, sq INTEGER, pad BLOB)")
db.commit()
ok = db.execute("PRAGMA integrity_check").fetchone()[0]
rows = db.execute("SELECT n, sq, pad FROM t ORDER BY n").fetchall()
prefix = all(r == (i, i * i, bytes([i % 251]) * 16384) for i, r in enumerate(rows, start=1))
n = len(rows)
note("start", n, ok, prefix, os.environ["SPOT_WORKER_CHECKPOINT_INTERVAL"])
while n < 4000:
    n += 1
    db.execute("INSERT INTO t VALUES (?, ?, ?)", (n, n * n, bytes([n % 251]) * 16384))
    db.commit()
    note("committed", n)
    time.sleep(0.25)
"#;
    let log_arg = log.display().to_string();
    let args = ["--", "python3", "-c", program, log_arg.as_str()];
    let starts = |log: &std::path::Path| -> Vec<Vec<String>> {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter(|line| line.starts_with("start "))
            .map(|line| line.split_whitespace().map(str::to_owned).collect())
            .collect()
    };
    let mut first = spot_worker_run(&args, &connection_string, &emulator.url())
        .spawn()
        .unwrap();
    let waited = std::time::Instant::now();
    while starts(&log).is_empty() && waited.elapsed() < PATIENCE {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(starts(&log).len(), 1, "the program did not start");
    // The scenario: the VM dies 20 s into the job, runner and all.
    tokio::time::sleep(Duration::from_secs(20)).await;
    first.start_kill().unwrap();
    tokio::time::timeout(PATIENCE, first.wait())
        .await
        .expect("SIGKILL ends the runner")
        .unwrap();
    let committed: Vec<(u64, f64)> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter(|line| line.starts_with("committed "))
        .map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            (words[1].parse().unwrap(), words[2].parse().unwrap())
        })
        .collect();
    let &(last, last_at) = committed.last().expect("the program committed rows");

    let next = spot_worker_run(&args, &connection_string, &emulator.url())
        .spawn()
        .unwrap();
    let waited = std::time::Instant::now();
    while starts(&log).len() < 2 && waited.elapsed() < PATIENCE {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(next);
    let all = starts(&log);
    assert_eq!(all.len(), 2, "the job was not resumed");
    let (first_start, resumed) = (&all[0], &all[1]);
    let interval: f64 = first_start[4].parse().unwrap();
    let rows: u64 = resumed[1].parse().unwrap();
    assert_eq!(
        resumed[2], "ok",
        "PRAGMA integrity_check of the restored database"
    );
    assert_eq!(
        resumed[3], "True",
        "the restored rows are not a prefix of those written"
    );
    assert!(rows <= last, "{rows} rows restored of {last} committed");
    // Lost: from the last commit the restored database holds to the
    // last one before the kill (the program's own times).
    let kept_at = committed
        .iter()
        .find(|(n, _)| *n == rows)
        .map_or(first_start[5].parse::<f64>().unwrap(), |(_, at)| *at);
    let lost = last_at - kept_at;
    eprintln!(
        "interval {interval} s; {last} rows committed, {rows} restored: {lost:.2} s of rows lost"
    );
    // One interval, and beside it a commit, a look and a save's time
    // (allowed 2 s: a slow machine's save takes longer, not the runner).
    assert!(
        lost <= interval + 2.0,
        "{lost:.2} s of rows lost with an interval of {interval} s"
    );
    // Before any save is measured the interval is the floor, seconds; the
    // database's age is never taken for a save's cost.
    assert!(
        interval < 60.0,
        "the program was handed an interval of {interval} s"
    );
}
