#!/usr/bin/env python3
"""The primes job as a program for `spot-worker run` (standard library only).

Reads {"job_id":"j1","start":0,"end":50000000} on stdin, counts the primes in
[start, end) with a segmented sieve, and writes the same result the Rust
`primes` job writes, byte for byte:
{"job_id":"j1","start":0,"end":50000000,"primes":3001134}

Progress {"cursor":N,"primes":M} goes to $SPOT_WORKER_CHECKPOINT (written to a
temporary file, then renamed) every few seconds (`--save-every SECONDS`, or
$PRIMES_SAVE_EVERY; 3 by default) and when SIGTERM comes; a
later delivery finds it there and resumes. With it goes the fraction of the
range done, to $SPOT_WORKER_PROGRESS, so the runner spreads its saves over
the rest of the job. Exit 65 for a body that is not a
job (poisoned at once), 143 when stopped by SIGTERM (the runner hands the job
back, uncounted).

    spot-worker run --job-key job_id --result-name '{job_key}.json' \\
        -- python3 examples/command/primes.py
"""

import argparse
import json
import math
import os
import signal
import sys
import time

SEGMENT = 1 << 20
SAVE_EVERY = float(os.environ.get("PRIMES_SAVE_EVERY", "3"))
EX_DATAERR = 65

stopping = False


def on_sigterm(_signum, _frame):
    global stopping
    stopping = True


def bad_job(reason):
    print(f"not a primes job: {reason}", file=sys.stderr)
    sys.exit(EX_DATAERR)


def read_job():
    try:
        job = json.loads(sys.stdin.buffer.read())
    except ValueError as error:
        bad_job(f"the body is not JSON: {error}")
    if not isinstance(job, dict):
        bad_job("the body is not a JSON object")
    job_id, start, end = job.get("job_id"), job.get("start"), job.get("end")
    if not isinstance(job_id, str) or not job_id:
        bad_job("job_id must be a non-empty string")
    for name, value in (("start", start), ("end", end)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            bad_job(f"{name} must be a non-negative integer")
    if start > end:
        bad_job(f"start {start} is greater than end {end}")
    return job_id, start, end


def base_primes(limit):
    """The primes up to and including limit."""
    if limit < 2:
        return []
    sieve = bytearray([1]) * (limit + 1)
    sieve[0:2] = b"\x00\x00"
    for p in range(2, math.isqrt(limit) + 1):
        if sieve[p]:
            sieve[p * p :: p] = bytes(len(range(p * p, limit + 1, p)))
    return [p for p in range(limit + 1) if sieve[p]]


def count_segment(base, lo, hi):
    """The primes in [lo, hi)."""
    segment = bytearray([1]) * (hi - lo)
    for n in range(lo, min(hi, 2)):
        segment[n - lo] = 0
    for p in base:
        if p * p >= hi:
            break
        first = max(p * p, (lo + p - 1) // p * p)
        segment[first - lo :: p] = bytes(len(range(first - lo, hi - lo, p)))
    return segment.count(1)


def write_whole(path, text):
    """Replaces the file at once: a temporary file, then a rename."""
    temporary = path + ".tmp"
    with open(temporary, "w") as file:
        file.write(text)
    os.replace(temporary, path)


def main():
    global SAVE_EVERY
    parser = argparse.ArgumentParser(description="the primes job for spot-worker run")
    parser.add_argument("--save-every", type=float, default=SAVE_EVERY, metavar="SECONDS",
                        help="seconds between two progress saves (default %(default)s)")
    SAVE_EVERY = parser.parse_args().save_every
    signal.signal(signal.SIGTERM, on_sigterm)
    job_id, start, end = read_job()
    checkpoint = os.environ["SPOT_WORKER_CHECKPOINT"]
    cursor, primes = start, 0
    if os.path.exists(checkpoint):
        with open(checkpoint) as file:
            saved = json.load(file)
        cursor, primes = saved["cursor"], saved["primes"]
        if not start <= cursor <= end:
            bad_job(f"the checkpoint {saved} does not fit [{start}, {end})")
        print(f"job {job_id}: resuming at {cursor} with {primes} primes", file=sys.stderr)

    progress = os.environ.get("SPOT_WORKER_PROGRESS")

    def save():
        write_whole(checkpoint, json.dumps({"cursor": cursor, "primes": primes}))
        if progress:
            write_whole(progress, f"{(cursor - start) / max(end - start, 1):.6f}\n")

    base = base_primes(math.isqrt(max(end - 1, 0)))
    saved_at = time.monotonic()
    while cursor < end:
        if stopping:
            save()
            print(f"job {job_id}: stopped at {cursor}, progress saved", file=sys.stderr)
            sys.exit(128 + signal.SIGTERM)
        hi = min(cursor + SEGMENT, end)
        primes += count_segment(base, cursor, hi)
        cursor = hi
        if time.monotonic() - saved_at >= SAVE_EVERY:
            save()
            saved_at = time.monotonic()

    result = {"job_id": job_id, "start": start, "end": end, "primes": primes}
    write_whole(os.environ["SPOT_WORKER_RESULT"], json.dumps(result, separators=(",", ":")))
    print(f"job {job_id}: {primes} primes in [{start}, {end})")


if __name__ == "__main__":
    main()
