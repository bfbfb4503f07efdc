//! Re-runs one test of this binary inside new network, mount and PID
//! namespaces (`unshare --net --mount --pid --fork --kill-child`, inside a
//! user namespace when not run as root): a
//! loopback-only network the test configures, a private mount table for
//! `/etc/hosts` and the CA bundle, and a PID namespace whose first process
//! is the inner test, so that when it ends, or is killed, the kernel kills
//! everything it started (Azurite, workers, scripts).

use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Set for the inner run; the outer test leaves the work to it.
pub const INSIDE_ENV: &str = "SPOT_WORKER_VM_IN_A_BOX_INSIDE";
/// `SPOT_WORKER_VM_IN_A_BOX=0` skips the rehearsal, explicitly and loudly.
pub const OPT_OUT_ENV: &str = "SPOT_WORKER_VM_IN_A_BOX";

/// Whether this process is the inner run.
pub fn inside() -> bool {
    std::env::var(INSIDE_ENV).as_deref() == Ok("1")
}

/// Whether the rehearsal was switched off on purpose (`0`, `false` or
/// `disabled`, as `scripts/test.sh` reads it).
pub fn opted_out() -> bool {
    matches!(
        std::env::var(OPT_OUT_ENV).as_deref(),
        Ok("0" | "false" | "disabled")
    )
}

/// Removes the proxy settings of the machine running the tests from the
/// inner run's environment: they do not exist on the VM or node, and no
/// proxy is reachable in the box (a case that wants one sets its own for
/// the worker). Called first by the inner half, the only test of its
/// process.
pub fn forget_the_machines_proxies() {
    assert!(
        inside(),
        "only the inner run, alone in its process, may change its environment"
    );
    for name in [
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
    ] {
        // SAFETY: the only test of this (inner) process, before any client
        // or child process reads the environment.
        unsafe { std::env::remove_var(name) };
    }
}

/// What the inner run printed and how it ended.
pub struct InnerRun {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// The name the test harness gives the test `function` of the module
/// `module` (its `module_path!()`): the path without the crate's own name,
/// e.g. `vm_in_a_box::inside_the_box` for `it::vm_in_a_box`, which is what
/// `--exact` must be given to run that test and only it.
pub fn test_name(module: &str, function: &str) -> String {
    match module.split_once("::") {
        Some((_crate, path)) => format!("{path}::{function}"),
        None => function.to_owned(),
    }
}

/// Asserts that `--exact` with [`test_name`] picks out the ignored test
/// `function` of `module` and nothing else, as the harness lists it: the
/// inner half an outer test runs in the box is the one it means.
pub fn assert_found_exactly(module: &str, function: &str) {
    let name = test_name(module, function);
    let exe = std::env::current_exe().expect("the test binary's path");
    let output = Command::new(exe)
        .args(["--list", "--ignored", "--exact", &name])
        .output()
        .expect("the test binary lists its tests");
    assert!(
        output.status.success(),
        "listing the tests failed: {output:?}"
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let listed: Vec<&str> = stdout
        .lines()
        .filter_map(|line| line.strip_suffix(": test"))
        .collect();
    assert_eq!(listed, [name.as_str()], "`--exact {name}` lists:\n{stdout}");
}

/// The outer half of a rehearsal in a box, called `what`: unless this is
/// the inner run or the rehearsal is switched off, `prepare` builds what
/// the box needs outside it (false: skipped, having said why), then the
/// ignored test `function` of `module` (the caller's `module_path!()`)
/// runs inside the namespaces within `limit` and must pass; its transcript
/// is printed (`--nocapture` shows it).
pub fn rehearse(
    what: &str,
    module: &str,
    function: &str,
    limit: Duration,
    prepare: impl FnOnce() -> bool,
) {
    if inside() {
        return; // The inner run only runs `function`.
    }
    if opted_out() {
        eprintln!("SKIPPED: {what} ({OPT_OUT_ENV}=0)");
        return;
    }
    if !prepare() {
        return;
    }
    let run = run_inside(module, function, limit);
    println!("{}", run.stdout);
    assert!(
        run.status.success() && run.stdout.contains("test result: ok. 1 passed"),
        "{what} failed ({}):\n{}\n{}",
        run.status,
        run.stdout,
        run.stderr
    );
}

/// Runs the ignored test `function` of the module `module` (the caller's
/// `module_path!()`) of this binary inside the namespaces, for at most
/// `limit`. Panics with a clear message if namespaces cannot be made.
pub fn run_inside(module: &str, function: &str, limit: Duration) -> InnerRun {
    let test_name = test_name(module, function);
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut unshare = Command::new("unshare");
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        // Without root, a user namespace in which this user is root owns
        // the others (where the kernel allows unprivileged user namespaces).
        unshare.args(["--user", "--map-root-user"]);
    }
    let mut child = unshare
        .args(["--net", "--mount", "--propagation", "private"])
        .args(["--pid", "--fork", "--kill-child"])
        .arg("--")
        .arg(exe)
        .args([
            "--ignored",
            "--exact",
            &test_name,
            "--nocapture",
            "--test-threads=1",
        ])
        .env(INSIDE_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run unshare(1) to make the VM's namespaces: {e}. Install util-linux, \
                 or set {OPT_OUT_ENV}=0 to skip this rehearsal explicitly"
            )
        });
    let stdout = drain(child.stdout.take().expect("piped"));
    let stderr = drain(child.stderr.take().expect("piped"));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for unshare") {
            break status;
        }
        if Instant::now() >= deadline {
            // --kill-child: the inner run dies with unshare, and the
            // kernel then kills every process of its PID namespace.
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the rehearsal did not finish within {limit:?}; its output:\n{}\n{}",
                stdout.join().unwrap_or_default(),
                stderr.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let run = InnerRun {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    };
    let unavailable = !run.status.success()
        && run.stderr.contains("unshare failed")
        && !run.stdout.contains("running 1 test");
    assert!(
        !unavailable,
        "network/mount/PID namespaces are unavailable here ({}): run as root (or with \
         unprivileged user namespaces), or set {OPT_OUT_ENV}=0 to skip this rehearsal \
         explicitly",
        run.stderr.trim()
    );
    run
}

/// Reads a pipe to its end on a thread.
fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}
