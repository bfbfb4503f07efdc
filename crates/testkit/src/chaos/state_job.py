#!/usr/bin/env python3
"""The chaos run's job for `spot-worker run`: a chain of SHA-256 rounds whose
state lives in a checkpoint directory of several chunks.

The message is {"job_id": ..., "steps": S, "rounds": R, "bytes": B,
"step_ms": P}. A step takes at least P ms (the work's pace: a job lasts long
enough for the runner to save it a few times whatever the machine's load,
without burning the shared cores). The state
is a 32-byte digest: sha256(b"state-job:" + job_id) to begin with; step i
hashes it R times with i (8 bytes, big-endian) appended each time. After each
step the program writes a whole new version, v<step>/ in
SPOT_WORKER_CHECKPOINT_DIR: two files `data-0` and `data-1` of B bytes each
derived from the digest (SHAKE-256), each over what a manifest keeps whole, so
a version is never fewer than two chunks, and `state.json` naming the step and
the digest, all written in a temporary directory in SPOT_WORKER_WORK_DIR (the
runner never sees a version half written) renamed into place; then it
removes the older versions. On a restore it takes the newest
complete version and checks that its data is the one its digest gives: a
checkpoint restored wrong or mixed exits 3 (a failure the run counts).

The result is the final digest in hex: the harness computes it on its own
(chaos/command_jobs.rs), so a result is right only if no step was lost, done
twice or resumed from a wrong state.
"""

import hashlib
import json
import os
import shutil
import sys
import time


FILES = 2


def data_of(digest, index, size):
    return hashlib.shake_256(digest + bytes([index])).digest(size)


def newest_version(root):
    """The newest complete version (step, digest, dir), or None."""
    best = None
    for name in os.listdir(root):
        if not name.startswith("v"):
            continue
        path = os.path.join(root, name)
        try:
            with open(os.path.join(path, "state.json")) as f:
                state = json.load(f)
        except (OSError, ValueError):
            continue
        if best is None or state["step"] > best[0]:
            best = (state["step"], bytes.fromhex(state["digest"]), path)
    return best


def main():
    job = json.load(sys.stdin)
    key, steps, rounds, size = job["job_id"], job["steps"], job["rounds"], job["bytes"]
    pace = job["step_ms"] / 1000
    root = os.environ["SPOT_WORKER_CHECKPOINT_DIR"]
    found = newest_version(root)
    if found is None:
        step, digest = 0, hashlib.sha256(b"state-job:" + key.encode()).digest()
    else:
        step, digest, path = found
        for index in range(FILES):
            with open(os.path.join(path, f"data-{index}"), "rb") as f:
                if f.read() != data_of(digest, index, size):
                    print(f"{key}: the restored version {path} is not the one its digest gives", file=sys.stderr)
                    return 3
        print(f"{key}: resumed at step {step}", flush=True)
    while step < steps:
        began = time.monotonic()
        for _ in range(rounds):
            digest = hashlib.sha256(digest + step.to_bytes(8, "big")).digest()
        step += 1
        temporary = os.path.join(os.environ["SPOT_WORKER_WORK_DIR"], f"next-{step}")
        shutil.rmtree(temporary, ignore_errors=True)
        os.mkdir(temporary)
        for index in range(FILES):
            with open(os.path.join(temporary, f"data-{index}"), "wb") as f:
                f.write(data_of(digest, index, size))
        with open(os.path.join(temporary, "state.json"), "w") as f:
            json.dump({"step": step, "digest": digest.hex()}, f)
        os.rename(temporary, os.path.join(root, f"v{step}"))
        for name in os.listdir(root):
            if name != f"v{step}":
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        time.sleep(max(0.0, pace - (time.monotonic() - began)))
    with open(os.environ["SPOT_WORKER_RESULT"], "w") as f:
        f.write(digest.hex() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
