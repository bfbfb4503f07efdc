#!/usr/bin/env python3
"""Runs the workspace's test binaries side by side: scripts/test.sh's test phase.

`cargo test --workspace --all-targets` runs its binaries one after another,
and most of them wait (on child processes, Azurite, timeouts) rather than
compute. This builds every test binary once (`cargo test --no-run`, the same
targets and profile), then runs them in a bounded pool, each in its package's
directory as cargo runs it, each suite's output in its own log
(target/test-logs/), a failed suite's log printed whole, and at the end every
suite's wall time, slowest first, and the failures. No fail-fast: every
suite runs; the exit status is 1 if any failed.

Suites that share something outside the process (podman's storage and the
image scripts/build-image.sh builds) hold a named lock: one at a time.
Slow suites start first (the times of the last run, else a fixed list), so
the pool does not end waiting on one long suite. `--quick` leaves out the
benches and the slow end-to-end suites (the developers' loop; CI runs all).

A lock can also be gated on a file (`--gate LOCK=PATH`): its suites start
only once PATH exists (or the suite timeout has passed). scripts/test.sh builds the image's binaries in the
background, then the README's install on the same target/image, and gates
the podman suites on the end of both, so they do not hold a place in the
pool waiting on cargo's lock while other suites could run.

usage: scripts/run-tests.py [--jobs N] [--quick] [--suite-timeout SECONDS]
                            [--gate LOCK=PATH]...
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Suites that share state outside their process, by lock name: the
# container image (scripts/build-image.sh builds one tag from target/image)
# and podman's storage are used by these, so they run one at a time.
LOCKS = {
    "spot-worker/test/it::container_image": "podman-and-image",
    "spot-worker/test/it::pod_in_a_box": "podman-and-image",
    "spot-worker/bench/image_start": "podman-and-image",
}

# Started first on a run without recorded times (the slowest of CI's run of
# 2026-11-29, in seconds), so the long ones overlap the many short ones.
SLOW_FIRST = [
    "spot-worker/test/it::container_image",
    "spot-worker/test/it::vm_in_a_box",
    "spot-worker/test/it::pod_in_a_box",
    "spot-worker-cli/test/it::docs",
    "spot-worker/test/it::chaos",
    "spot-worker-command/test/it::spread",
    "spot-worker/test/store_refusal",
    "spot-worker-cli/test/it::run",
    "spot-worker-cli/test/it::operate",
    "spot-worker-storage/test/it::fault_search",
]

# Left out by --quick: the end-to-end suites that need podman or namespaces
# or run for minutes, the suites that took 15 s or more in CI's run of
# 2026-11-29, and the property tests' suites (CI's full run has them all;
# the unit suites all run, less QUICK_SKIP_TESTS).
QUICK_SKIPS = {
    "spot-worker/test/it::container_image",
    "spot-worker/test/it::vm_in_a_box",
    "spot-worker/test/it::pod_in_a_box",
    "spot-worker/test/it::pod_deletion_cost",
    "spot-worker/test/it::chaos",
    "spot-worker/test/store_refusal",
    "spot-worker/test/it::storage_permissions",
    "spot-worker/test/it::worker",
    "spot-worker/test/it::worker_exit",
    "spot-worker-cli/test/it::docs",
    "spot-worker-cli/test/it::dev",
    "spot-worker-cli/test/it::run",
    "spot-worker-cli/test/it::operate",
    "spot-worker-cli/test/it::run_optuna",
    "spot-worker-cli/test/it::lanes",
    "spot-worker-cli/test/it::run_large",
    "spot-worker-cli/test/it::demo_command",
    "spot-worker-cli/test/it::run_peers",
    "spot-worker-command/test/it::spread",
    "spot-worker-command/test/it::eviction",
    "spot-worker-command/test/it::notice",
    "spot-worker-command/test/it::sqlite",
    "spot-worker-command/test/it::sqlite_marker",
    "spot-worker-command/test/it::sqlite_redone",
    "spot-worker-azure/test/it::queue",
    "spot-worker-azure/test/it::result",
    "spot-worker-storage/test/it::fault_search",
    "spot-worker-azure/test/it::bad_input",
    "spot-worker-command/test/it::bad_input",
    "spot-worker-consumer/test/it::bad_input",
    "spot-worker-consumer/test/it::records_bad_input",
    "spot-worker-imds/test/it::bad_input",
    "spot-worker-settings/test/it::bad_input",
}

# Tests left out by --quick inside the suites it runs, by a part of their
# names (libtest's `--skip`): the property tests (`bad_input` modules, 10,000
# cases each, unoptimised) and the unit tests that wait on real processes
# or time for half a minute or more (the local crate's Azurite processes, a
# thousand simulated workers' mass eviction, a database locked past every
# retry). CI's full run has them all.
QUICK_SKIP_TESTS = [
    "bad_input::",
    "mass_eviction::",
    "azurite::",
    "a_database_locked_at_every_try_is_an_error",
]

# The kinds of target `cargo test --all-targets` runs (examples' tests are
# built and run too, as unittests of the example).
RUN_KINDS = {"lib", "bin", "test", "bench", "example", "proc-macro", "cdylib", "rlib"}

TIMES_FILE = "test-logs/times.json"


@dataclass
class Suite:
    """One test executable, run as cargo runs it."""

    name: str
    executable: str
    cwd: str
    package: str
    lock: str | None = None
    args: list[str] = field(default_factory=list)


@dataclass
class Outcome:
    """How one suite ended."""

    suite: Suite
    seconds: float
    code: int
    log: Path
    timed_out: bool = False
    cpu: float = 0.0


def build(cargo: str, quick: bool) -> list[Suite]:
    """Builds every test binary once and returns them as suites."""
    targets = (
        ["--lib", "--bins", "--tests", "--examples"] if quick else ["--all-targets"]
    )
    command = [
        cargo,
        "test",
        "--workspace",
        *targets,
        "--locked",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]
    print("==> " + " ".join(command[1:]), flush=True)
    started = time.monotonic()
    done = subprocess.run(
        command, cwd=ROOT, stdout=subprocess.PIPE, text=True, check=False
    )
    if done.returncode != 0:
        sys.exit(f"the test build failed (exit {done.returncode})")
    print(f"    built in {time.monotonic() - started:.0f} s", flush=True)
    suites: dict[str, Suite] = {}
    for line in done.stdout.splitlines():
        message = json.loads(line)
        if message.get("reason") != "compiler-artifact" or not message.get(
            "executable"
        ):
            continue
        if not message["profile"]["test"]:
            continue
        target = message["target"]
        kind = target["kind"][0]
        if kind not in RUN_KINDS:
            continue
        package = package_name(message["package_id"])
        label = "unit" if kind in {"lib", "proc-macro", "rlib", "cdylib"} else kind
        name = f"{package}/{label}/{target['name']}"
        suites[name] = Suite(
            name=name,
            executable=message["executable"],
            cwd=str(Path(message["manifest_path"]).parent),
            package=package,
            lock=LOCKS.get(name),
        )
    return [
        part
        for suite in suites.values()
        for part in (
            split_by_module(suite) if suite.name.endswith("/test/it") else [suite]
        )
    ]


def package_name(package_id: str) -> str:
    """The package's name in cargo's package id.

    `path+file:///dir/crates/cli#spot-worker-cli@0.1.0`, or
    `path+file:///dir/name#0.1.0` when the name is the directory's.
    """
    location, _, fragment = package_id.rpartition("#")
    if "@" in fragment:
        return fragment.split("@", 1)[0]
    return location.rstrip("/").rsplit("/", 1)[-1]


def split_by_module(suite: Suite) -> list[Suite]:
    """One suite per top-level module of an `it` binary (one per former test file).

    Each runs in its own process, by its tests' exact names, as each file
    ran when it was its own binary: side by side, and apart.
    """
    listed = subprocess.run(
        [suite.executable, "--list", "--format", "terse"],
        cwd=suite.cwd,
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    ).stdout
    modules: dict[str, list[str]] = {}
    for line in listed.splitlines():
        name, _, kind = line.rpartition(": ")
        if kind not in {"test", "bench"}:
            continue
        module = name.split("::", 1)[0] if "::" in name else "main"
        modules.setdefault(module, []).append(name)
    return [
        Suite(
            name=f"{suite.name}::{module}",
            executable=suite.executable,
            cwd=suite.cwd,
            package=suite.package,
            lock=LOCKS.get(f"{suite.name}::{module}", suite.lock),
            args=[*names, "--exact"],
        )
        for module, names in sorted(modules.items())
    ]


def order(suites: list[Suite], times: dict[str, float]) -> list[Suite]:
    """Slowest first: by the last run's times, else by SLOW_FIRST."""

    def key(suite: Suite) -> tuple[float, str]:
        if suite.name in times:
            return (-times[suite.name], suite.name)
        if suite.name in SLOW_FIRST:
            return (-1e6 + SLOW_FIRST.index(suite.name), suite.name)
        return (0.0, suite.name)

    return sorted(suites, key=key)


def start(suite: Suite, logs: Path, cargo: str) -> tuple[subprocess.Popen[bytes], Path]:
    """Starts one suite in its package's directory, output to its log."""
    log = logs / (suite.name.replace("/", "__") + ".log")
    env = dict(os.environ)
    env.setdefault("CARGO", cargo)
    env["CARGO_MANIFEST_DIR"] = suite.cwd
    env["CARGO_PKG_NAME"] = suite.package
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [suite.executable, *suite.args],
            cwd=suite.cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return process, log


def stop(process: subprocess.Popen[bytes]) -> None:
    """Kills a suite and everything it started (its own process group)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def run(
    suites: list[Suite],
    jobs: int,
    timeout: float,
    logs: Path,
    cargo: str,
    gates: dict[str, Path] | None = None,
) -> list[Outcome]:
    """Runs every suite, at most `jobs` at once, one per lock, and a gated
    lock's suites only once its file exists."""
    gates = gates or {}
    started = time.monotonic()
    waiting = list(suites)
    running: dict[str, tuple[subprocess.Popen[bytes], Path, float]] = {}
    by_name = {suite.name: suite for suite in suites}
    outcomes: list[Outcome] = []
    # Bounded: each pass either starts, finishes or waits 0.2 s, every
    # suite ends by its timeout, and a gate that never opens ends with the
    # deadline (its suites then fail as never started).
    deadline = time.monotonic() + timeout * max(1, len(suites)) + 60
    while (waiting or running) and time.monotonic() < deadline:
        held = {by_name[name].lock for name in running} - {None}
        # A gate left shut past the suite timeout opens anyway: its suites
        # then build what they need themselves.
        if time.monotonic() - started < timeout:
            held |= {lock for lock, path in gates.items() if not path.exists()}
        for suite in list(waiting):
            if len(running) >= jobs:
                break
            if suite.lock in held:
                continue
            process, log = start(suite, logs, cargo)
            running[suite.name] = (process, log, time.monotonic())
            waiting.remove(suite)
            if suite.lock:
                held.add(suite.lock)
        for name, (process, log, began) in list(running.items()):
            seconds = time.monotonic() - began
            code, cpu = reap(process)
            timed_out = code is None and seconds > timeout
            if timed_out:
                stop(process)
                code, cpu = -1, 0.0
            if code is None:
                continue
            del running[name]
            outcome = Outcome(by_name[name], seconds, code, log, timed_out, cpu)
            outcomes.append(outcome)
            report(outcome)
        time.sleep(0.2)
    for name, (process, log, began) in running.items():
        stop(process)
        outcomes.append(Outcome(by_name[name], time.monotonic() - began, -1, log, True))
    for suite in waiting:
        outcomes.append(Outcome(suite, 0.0, -1, logs / "never-started", True))
    return outcomes


def reap(process: subprocess.Popen[bytes]) -> tuple[int | None, float]:
    """The suite's exit code and CPU seconds (its own and its waited-for
    children's, user and system), or (None, 0) while it runs."""
    pid, status, usage = os.wait4(process.pid, os.WNOHANG)
    if pid == 0:
        return None, 0.0
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, usage.ru_utime + usage.ru_stime


def report(outcome: Outcome) -> None:
    """One line per finished suite; a failed suite's whole log."""
    if outcome.code == 0:
        print(
            f"    ok     {outcome.seconds:7.1f} s  {outcome.cpu:7.1f} s CPU  {outcome.suite.name}",
            flush=True,
        )
        return
    why = "timed out" if outcome.timed_out else f"exit {outcome.code}"
    print(
        f"    FAILED {outcome.seconds:7.1f} s  {outcome.suite.name} ({why}); its log:",
        flush=True,
    )
    print(outcome.log.read_text(errors="replace"), flush=True)
    print(f"    (end of {outcome.suite.name}'s log, {outcome.log})", flush=True)


def summary(outcomes: list[Outcome], wall: float) -> int:
    """Every suite's time, slowest first, then the failures; the exit status."""
    print(
        f"==> suite times (wall {wall:.0f} s; sum {sum(o.seconds for o in outcomes):.0f} s;"
        f" CPU {sum(o.cpu for o in outcomes):.0f} s): wall, CPU, suite"
    )
    for outcome in sorted(outcomes, key=lambda o: -o.seconds):
        state = "ok" if outcome.code == 0 else "FAILED"
        print(
            f"    {outcome.seconds:7.1f} s  {outcome.cpu:7.1f} s  {state:6}  {outcome.suite.name}"
        )
    failed = [o for o in outcomes if o.code != 0]
    if failed:
        print(f"==> {len(failed)} of {len(outcomes)} suites failed:")
        for outcome in failed:
            print(f"    {outcome.suite.name} (log: {outcome.log})")
        return 1
    print(f"==> all {len(outcomes)} suites passed")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--jobs", type=int, default=3, help="suites at once (default 3)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="no benches, no slow end-to-end suites"
    )
    parser.add_argument(
        "--suite-timeout",
        type=float,
        default=1800.0,
        help="seconds before a suite is killed and failed (default 1800)",
    )
    parser.add_argument(
        "--gate",
        action="append",
        default=[],
        metavar="LOCK=PATH",
        help="start LOCK's suites only once PATH exists",
    )
    options = parser.parse_args()
    gates: dict[str, Path] = {}
    for gate in options.gate:
        lock, sep, path = gate.partition("=")
        if not sep or lock not in set(LOCKS.values()):
            parser.error(f"--gate {gate}: not LOCK=PATH with a LOCK of {sorted(set(LOCKS.values()))}")
        gates[lock] = Path(path)
    if options.jobs < 1:
        parser.error("--jobs must be at least 1")
    cargo = os.environ.get("CARGO") or shutil.which("cargo") or "cargo"
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    logs = target / "test-logs"
    logs.mkdir(parents=True, exist_ok=True)
    times_file = target / TIMES_FILE
    try:
        times = json.loads(times_file.read_text())
    except (OSError, ValueError):
        times = {}

    suites = all_suites = build(cargo, options.quick)
    if options.quick:
        skipped = sorted(s.name for s in suites if s.name in QUICK_SKIPS)
        suites = [s for s in suites if s.name not in QUICK_SKIPS]
        print(f"    --quick leaves out: {', '.join(skipped)}")
        stale = sorted(QUICK_SKIPS - {s.name for s in all_suites})
        if stale:
            print(f"    QUICK_SKIPS names no suite (renamed?): {', '.join(stale)}")
        skips = [arg for part in QUICK_SKIP_TESTS for arg in ("--skip", part)]
        # By substring, so only where the suite does not run by exact names
        # (an `it` module's suite: its bad_input modules are in QUICK_SKIPS).
        for suite in suites:
            if "--exact" not in suite.args:
                suite.args = [*suite.args, *skips]
        print(f"    --quick leaves out the tests named: {', '.join(QUICK_SKIP_TESTS)}")
    print(
        f"==> {len(suites)} suites, {options.jobs} at once (logs: {logs})", flush=True
    )
    began = time.monotonic()
    outcomes = run(
        order(suites, times), options.jobs, options.suite_timeout, logs, cargo, gates
    )
    status = summary(outcomes, time.monotonic() - began)
    times.update({o.suite.name: round(o.seconds, 1) for o in outcomes if o.code == 0})
    times_file.write_text(json.dumps(times, indent=1, sort_keys=True) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
