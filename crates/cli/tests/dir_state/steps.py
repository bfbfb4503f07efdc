"""A program whose state is a directory of two files, run by
tests/it/run_dir_state.rs under `spot-worker run`.

Step N writes a.txt = N, then b.txt = N (each whole: a temporary file
renamed over it), then, with STEPS_MARKER set, the commit marker
COMMIT = N. The states the directory is ever in are therefore exactly:
no files (or the ballast alone, below); a = 1 alone; and for every N >= 1 (a = N, b = N) and
(a = N + 1, b = N); with the marker, each of those with COMMIT = the
last N it wrote, and the committed states are a = b = COMMIT.

A ballast file of STEPS_BALLAST bytes (random, written once at the
start and never changed) makes every read of the directory take a while,
so a read while it steps finds a.txt and b.txt changing.

It steps without pause ("busy": the directory never holds still) until
the file STEPS_GO/calm exists; then it ends its step, appends
"calm N" to STEPS_LOG and holds still. With STEPS_GO/after, it then
writes a.txt = N + 1 (the start of a step it never ends) and holds
still again. Started on a restored directory (any file in it), it appends
"restored A B COMMIT" (`-` for a missing file) and exits 0.
"""

import os
import time

ck = os.environ["SPOT_WORKER_CHECKPOINT_DIR"]
go = os.environ["STEPS_GO"]
log = os.environ["STEPS_LOG"]
marker = os.environ.get("STEPS_MARKER") == "1"


def read(name):
    try:
        with open(os.path.join(ck, name)) as f:
            return f.read()
    except FileNotFoundError:
        return "-"


def write(name, value):
    tmp = os.path.join(ck, "." + name + ".tmp")
    with open(tmp, "w") as f:
        f.write(str(value))
    os.rename(tmp, os.path.join(ck, name))


def say(line):
    with open(log, "a") as f:
        f.write(line + "\n")


def wait_for(name):
    while not os.path.exists(os.path.join(go, name)):
        time.sleep(0.01)


if os.listdir(ck):
    say(f"restored {read('a.txt')} {read('b.txt')} {read('COMMIT')}")
    raise SystemExit(0)

ballast = int(os.environ.get("STEPS_BALLAST", "0"))
if ballast:
    # Written aside and renamed in: the directory's first state is the
    # ballast alone, and the steps start at once.
    aside = os.path.join(os.environ["SPOT_WORKER_WORK_DIR"], "ballast")
    with open(aside, "wb") as f:
        f.write(os.urandom(ballast))
    os.rename(aside, os.path.join(ck, "ballast.bin"))

calm = os.path.join(go, "calm")
step = 0
while True:
    step += 1
    write("a.txt", step)
    write("b.txt", step)
    if marker:
        write("COMMIT", step)
    if os.path.exists(calm):
        break
say(f"calm {step}")
wait_for("after")
write("a.txt", step + 1)
say(f"after {step + 1}")
while True:
    time.sleep(1)
