# A training loop as the large-state tests run it. Its parameters are
# TRAIN_SIZE deterministic bytes (no numpy needed): the checkpoint file
# ($SPOT_WORKER_CHECKPOINT), or with TRAIN_LAYOUT=dir four shards in the
# checkpoint directory, as frameworks write them. Beside them in the
# directory: the optimizer's state (128 KiB, derived from the parameters,
# so a torn checkpoint is caught on resume) and the epoch.
#
# Each epoch changes one region of 1 % of the parameters, except every
# third (2, 5, ...), an evaluation pass that leaves them as they are; every
# epoch saves everything, each file written aside and renamed into place.
#
# TRAIN_GO      a directory: after epoch N the loop waits for its file go-N
#               (the test's pace; a SIGTERM ends the wait)
# TRAIN_LOG     a file: "N" appended once epoch N is saved
# TRAIN_SIGNAL_FILE  a watcher process in the program's group writes there
#               when the group's stop signal arrived (CLOCK_MONOTONIC, ns)
# TRAIN_ON_STOP=huge  on SIGTERM, a last checkpoint of 100 GB (a sparse
#               shard) before exiting: a final save too big for any drain
#
# SIGTERM: exit 143 at the end of the epoch being saved, or at once while
# waiting. The result: the epoch count and the parameters' SHA-256.
import hashlib, os, random, signal, subprocess, sys, time

SIZE = int(os.environ["TRAIN_SIZE"])
EPOCHS = int(os.environ.get("TRAIN_EPOCHS", "6"))
LAYOUT = os.environ.get("TRAIN_LAYOUT", "file")
GO = os.environ.get("TRAIN_GO")
LOG = os.environ.get("TRAIN_LOG")
SHARDS = 4
ck = os.environ["SPOT_WORKER_CHECKPOINT"]
d = os.environ["SPOT_WORKER_CHECKPOINT_DIR"]
work = os.environ["SPOT_WORKER_WORK_DIR"]
stop = False


def on_term(signum, frame):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_term)
if os.environ.get("TRAIN_SIGNAL_FILE"):
    watch = os.path.join(os.path.dirname(os.path.abspath(__file__)), "watch.py")
    subprocess.Popen([sys.executable, watch, os.environ["TRAIN_SIGNAL_FILE"]])


def put(path, data):
    # Written in the work directory, renamed into place: the checkpoint
    # never holds a half-written file.
    aside = os.path.join(work, "aside")
    with open(aside, "wb") as f:
        f.write(data)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.replace(aside, path)


def shard_paths():
    return [os.path.join(d, "params", "shard-%d" % i) for i in range(SHARDS)]


def save(state, epoch):
    if LAYOUT == "dir":
        step = SIZE // SHARDS
        for i, path in enumerate(shard_paths()):
            end = SIZE if i == SHARDS - 1 else (i + 1) * step
            put(path, memoryview(state)[i * step:end])
    else:
        put(ck, state)
    put(os.path.join(d, "opt", "moments.bin"), hashlib.sha256(state).digest() * 4096)
    # Last: a directory with this epoch holds all of it.
    put(os.path.join(d, "epoch"), str(epoch).encode())


def load():
    if not os.path.exists(os.path.join(d, "epoch")):
        return None
    if LAYOUT == "dir":
        state = bytearray()
        for path in shard_paths():
            with open(path, "rb") as f:
                state += f.read()
    else:
        with open(ck, "rb") as f:
            state = bytearray(f.read())
    epoch = int(open(os.path.join(d, "epoch")).read())
    moments = open(os.path.join(d, "opt", "moments.bin"), "rb").read()
    assert len(state) == SIZE and hashlib.sha256(state).digest() == moments[:32], "a torn checkpoint"
    return state, epoch


def wait_for_go(epoch):
    if not GO:
        return
    path = os.path.join(GO, "go-%d" % epoch)
    while not stop and not os.path.exists(path):
        time.sleep(0.01)


def stopped():
    if os.environ.get("TRAIN_ON_STOP") == "huge":
        os.makedirs(os.path.join(d, "params"), exist_ok=True)
        with open(os.path.join(d, "params", "final-shard"), "wb") as f:
            f.truncate(100 * 10**9)
    sys.exit(143)


def initial(size):
    # In pieces: one randbytes call of 1 GiB or more overflows (it asks
    # getrandbits for more bits than a C int counts).
    r, state = random.Random(1), bytearray()
    while len(state) < size:
        state += r.randbytes(min(1 << 26, size - len(state)))
    return state


loaded = load()
if loaded:
    state, epoch = loaded
else:
    state, epoch = initial(SIZE), 0
region = SIZE // 100
while epoch < EPOCHS:
    epoch += 1
    if epoch % 3 != 2:
        r = random.Random(1000 + epoch)
        at = r.randrange(SIZE - region)
        state[at:at + region] = r.randbytes(region)
    save(state, epoch)
    if LOG:
        with open(LOG, "a") as f:
            f.write("%d\n" % epoch)
    if stop:
        stopped()
    if epoch < EPOCHS:
        wait_for_go(epoch)
    if stop:
        stopped()
put(os.environ["SPOT_WORKER_RESULT"], ("%d %s\n" % (epoch, hashlib.sha256(state).hexdigest())).encode())
