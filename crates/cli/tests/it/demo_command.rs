//! `spot-worker demo --command`: a Python job (`examples/command/primes.py`)
//! evicted mid-way on worker A, resumed on worker B from its checkpoint
//! file, its result checked against the Rust count. Needs `python3` (as the
//! VM in a box and the command crate's tests do).

use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

/// Bound on the whole demo: generous for a slow machine, finite for a bug.
const PATIENCE: Duration = Duration::from_secs(300);

#[tokio::test]
async fn the_command_demo_evicts_a_python_job_and_resumes_it_elsewhere() {
    let output = tokio::time::timeout(
        PATIENCE,
        Command::new(env!("CARGO_BIN_EXE_spot-worker"))
            .args(["demo", "--command", "--size", "1_000_000_000"])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the demo finishes in time")
    .expect("the binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    for line in [
        "A: the program saved its progress file",
        "A: drained in",
        "B: takes the job and hands the program its checkpoint file back",
        "verified: equals the Rust count, resumed from cursor",
    ] {
        assert!(stdout.contains(line), "{line:?} in:\n{stdout}");
    }
    let resumed_at: u64 = stdout
        .split("resumed from cursor ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("the cursor B resumed from");
    assert!(
        resumed_at > 0 && resumed_at < 1_000_000_000,
        "resumed mid-way: {resumed_at}"
    );
}
