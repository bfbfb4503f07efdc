//! Runs the `sh` blocks of one page, in order, in one `bash` session, as a
//! reader would type them into one shell: in a scratch directory that
//! mirrors the workspace (links to its top-level entries, so relative paths
//! work and files the page writes stay out of the clone), with the page's
//! file blocks written there first, `spot-worker` on `PATH`, and a local
//! environment (`spot-worker dev` on free ports, its variables exported)
//! already up, as docs/develop-locally.md sets one up. Background jobs
//! (`&`) are stopped with SIGTERM at the end and waited for.
//!
//! `cargo` is a stand-in that runs what the test build already made:
//! `cargo run [-p spot-worker-cli | --example NAME] [--release] -- ARGS`
//! runs that binary, `cargo install --path crates/cli` is satisfied by the
//! `spot-worker` on `PATH`; any other cargo command fails (tag its block
//! `sh no-ci`).

use std::fmt::Write as _;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::blocks::{Block, Kind};

/// The longest one page may take.
const PAGE_TIMEOUT: Duration = Duration::from_secs(300);

const CARGO_SHIM: &str = r#"#!/usr/bin/env bash
# The doc runner's cargo (crates/cli/tests/it/docs/session.rs): what the test build made.
set -euo pipefail
here="$(dirname "$(readlink -f "$(command -v spot-worker)")")"
case "${1:-}" in
  run)
    shift
    target="" example=""
    while (($#)); do
      case "$1" in
        --) shift; break ;;
        -p) [[ "$2" == spot-worker-cli ]] && target="$here/spot-worker"; shift 2 ;;
        --example) example="$2"; target="$here/examples/$2"; shift 2 ;;
        *) shift ;;
      esac
    done
    [[ -n "$target" ]] || { echo "doc runner: cargo run of an unknown target; tag the block sh no-ci" >&2; exit 97; }
    [[ -x "$target" ]] || { echo "doc runner: $target is not built (cargo build --example $example)" >&2; exit 97; }
    exec "$target" "$@" ;;
  install)
    [[ " $* " == *" --path crates/cli "* ]] && exit 0 ;;
esac
echo "doc runner: 'cargo $*' is not run in CI; tag the block sh no-ci" >&2
exit 97
"#;

/// What one page's run printed.
pub struct PageRun {
    /// Each `sh` block's output (stdout and stderr), in order.
    pub outputs: Vec<String>,
}

/// Three consecutive free loopback ports (Azurite's blob, queue, table)
/// and two more (the IMDS emulators of the Spot VM and, on the port after
/// it, of the regular VM); returns the first and the Spot VM's emulator's.
pub fn free_ports() -> (u16, u16) {
    // Below the ephemeral range (Linux: 32768 and up), where the kernel
    // never hands out a port on its own: a port found free here is not
    // taken by some process's outgoing connection before `spot-worker dev`
    // binds it, as ports from `bind(0)` can be on a busy machine (then
    // `dev` failed and the page waited two minutes for an environment).
    // The start is spread by the process id so that parallel runs differ.
    const LOW: u16 = 20_000;
    const SPAN: u16 = 12_000;
    let seed = std::process::id() as u64
        ^ u64::from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos()),
        );
    for attempt in 0..200u64 {
        let offset =
            (seed.wrapping_mul(2_654_435_761).wrapping_add(attempt * 97)) % u64::from(SPAN - 5);
        let first = LOW + offset as u16;
        let all_free =
            (first..first + 5).all(|p| TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_ok());
        if all_free {
            return (first, first + 3);
        }
    }
    panic!("no five consecutive free loopback ports");
}

/// Runs the page's `sh` blocks; panics with the failing block and the
/// session's output if one fails.
pub fn run_page(root: &Path, spot_worker: &Path, page: &[Block]) -> PageRun {
    let scratch = tempfile::Builder::new()
        .prefix("doc-page-")
        .tempdir()
        .unwrap();
    let dir = scratch.path();
    for entry in std::fs::read_dir(root).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        std::os::unix::fs::symlink(entry.path(), dir.join(&name)).unwrap();
    }
    let bin = dir.join(".doc-bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(spot_worker, bin.join("spot-worker")).unwrap();
    std::fs::write(bin.join("cargo"), CARGO_SHIM).unwrap();
    let mut permissions = std::fs::metadata(bin.join("cargo")).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(bin.join("cargo"), permissions).unwrap();
    for block in page {
        if let Kind::File(name) = &block.kind {
            std::fs::write(dir.join(name), &block.text).unwrap();
        }
    }

    let (azurite_port, imds_port) = free_ports();
    let addresses = format!("--azurite-port {azurite_port} --imds-listen 127.0.0.1:{imds_port}");
    let mut script = String::new();
    let _ = writeln!(
        script,
        "set -eo pipefail\n\
         trap 'kill -TERM $(jobs -p) 2>/dev/null; wait' EXIT\n\
         spot-worker dev {addresses} > .doc-env.log 2>&1 &\n\
         eval \"$(spot-worker dev env {addresses})\"\n\
         export SPOT_WORKER_HEALTH_ADDR=127.0.0.1:0"
    );
    let runs: Vec<&Block> = page.iter().filter(|b| b.kind == Kind::Run).collect();
    for (n, block) in runs.iter().enumerate() {
        let _ = writeln!(script, "echo '::doc-block {n}::'\n{}", block.text);
    }
    let _ = writeln!(script, "echo '::doc-end::'");
    let log_path = dir.join(".doc-session.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(dir)
        .env("PATH", path)
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .env_remove("AZURE_STORAGE_CONNECTION_STRING")
        .env_remove("SPOT_WORKER_IMDS_ENDPOINT")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .process_group(0)
        .spawn()
        .expect("bash runs");
    let deadline = Instant::now() + PAGE_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() >= deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    end_group(child.id());
    let output = std::fs::read_to_string(&log_path).unwrap_or_default();
    let env_log = std::fs::read_to_string(dir.join(".doc-env.log")).unwrap_or_default();
    let last_block = output
        .lines()
        .rev()
        .filter_map(|l| {
            l.strip_prefix("::doc-block ")
                .and_then(|r| r.strip_suffix("::"))
        })
        .find_map(|n| n.parse::<usize>().ok());
    let failing = || {
        last_block
            .and_then(|n| runs.get(n))
            .map_or("before the first block".to_owned(), |b| b.at())
    };
    match status {
        None => {
            let _ = child.wait();
            panic!(
                "{} did not finish within {PAGE_TIMEOUT:?}; output:\n{output}\nthe environment's log:\n{env_log}",
                failing()
            );
        }
        Some(status) if !status.success() || !output.contains("::doc-end::") => {
            panic!(
                "{} failed ({status}); output:\n{output}\nthe environment's log:\n{env_log}",
                failing()
            );
        }
        Some(_) => {}
    }
    let mut outputs = vec![String::new(); runs.len()];
    let mut current = None;
    for line in output.lines() {
        if let Some(n) = line
            .strip_prefix("::doc-block ")
            .and_then(|r| r.strip_suffix("::"))
        {
            current = n.parse::<usize>().ok();
        } else if line == "::doc-end::" {
            current = None;
        } else if let Some(n) = current {
            outputs[n].push_str(line);
            outputs[n].push('\n');
        }
    }
    PageRun { outputs }
}

/// Ends what is left of the session's process group (bash's jobs stop on
/// its EXIT trap; this covers a session that timed out or was killed):
/// SIGTERM, so a `spot-worker dev` stops its Azurite and worker, then
/// SIGKILL after 40 s (a worker's drain fits in it).
fn end_group(leader: u32) {
    let group = -(leader as libc::pid_t);
    // SAFETY: kill(2) has no memory-safety preconditions; the group is our child's.
    let alive = |signal| unsafe { libc::kill(group, signal) } == 0;
    if !alive(libc::SIGTERM) {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(40);
    while Instant::now() < deadline {
        if !alive(0) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    alive(libc::SIGKILL);
}

/// Each line of `expected` (a `text` block shown after a command) must
/// match a line of `output`, in order; `...` in it matches anything.
pub fn check_output(expected: &str, output: &str) -> Result<(), String> {
    let mut lines = output.lines();
    for want in expected.lines().filter(|l| !l.trim().is_empty()) {
        let parts: Vec<&str> = want.trim().split("...").collect();
        let found = lines.any(|line| matches(&parts, line));
        if !found {
            return Err(format!("no line like {want:?} (in order) in:\n{output}"));
        }
    }
    Ok(())
}

fn matches(parts: &[&str], line: &str) -> bool {
    let mut rest = line;
    for (i, part) in parts.iter().enumerate() {
        let Some(at) = rest.find(part) else {
            return false;
        };
        // The first part starts the line (after indentation), unless empty.
        if i == 0 && !part.is_empty() && !rest.trim_start().starts_with(part) {
            return false;
        }
        rest = &rest[at + part.len()..];
    }
    parts
        .last()
        .is_none_or(|last| last.is_empty() || rest.trim().is_empty())
}

/// Where the workspace is: two levels above this crate.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_output_matches_with_ellipses() {
        let output = "noise\nPreempt 5A1E posted for local_0 (NotBefore Mon): drains\napproved by the worker 412 ms after\n";
        assert!(check_output("Preempt ... posted for local_0 (NotBefore ...): drains\napproved by the worker ... ms after\n", output).is_ok());
        assert!(
            check_output("approved by the worker ... ms after\nPreempt ...\n", output).is_err(),
            "in order"
        );
        assert!(check_output("refused\n", output).is_err());
    }
}
