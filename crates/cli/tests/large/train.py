# A training loop as the large-state tests run it: a parameter file of
# SIZE bytes (deterministic bytes, no numpy needed), one region of 1 %
# changed per epoch, saved every epoch with its optimizer state in the
# checkpoint directory (temporary files renamed over the real ones). On
# SIGTERM it stops at the end of the epoch, exit 143. A watcher process in
# its group records when the stop signal arrived (CLOCK_MONOTONIC, ns).
import hashlib, os, random, signal, subprocess, sys, time

SIZE = int(os.environ.get("TRAIN_SIZE", str(192 << 20)))
EPOCHS = int(os.environ.get("TRAIN_EPOCHS", "10"))
LOG = os.environ.get("TRAIN_LOG")
ck = os.environ["SPOT_WORKER_CHECKPOINT"]
d = os.environ["SPOT_WORKER_CHECKPOINT_DIR"]
stop = False

def on_term(signum, frame):
    global stop
    stop = True

signal.signal(signal.SIGTERM, on_term)
if os.environ.get("TRAIN_SIGNAL_FILE"):
    subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "watch.py"), os.environ["TRAIN_SIGNAL_FILE"]])

def replace(path, data):
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)

if os.path.exists(ck):
    state = bytearray(open(ck, "rb").read())
    epoch = int(open(os.path.join(d, "epoch")).read())
    moments = open(os.path.join(d, "opt", "moments.bin"), "rb").read()
    assert len(state) == SIZE and hashlib.sha256(state).digest() == moments[:32], "a torn checkpoint"
else:
    state = bytearray(random.Random(1).randbytes(SIZE))
    epoch = 0
region = SIZE // 100
while epoch < EPOCHS:
    r = random.Random(1000 + epoch)
    at = r.randrange(SIZE - region)
    state[at:at + region] = r.randbytes(region)
    epoch += 1
    replace(ck, state)
    os.makedirs(os.path.join(d, "opt"), exist_ok=True)
    replace(os.path.join(d, "opt", "moments.bin"), hashlib.sha256(state).digest() * 4096)
    replace(os.path.join(d, "epoch"), str(epoch).encode())
    if LOG:
        with open(LOG, "a") as f:
            f.write("%d\n" % epoch)
    if stop:
        sys.exit(143)
    time.sleep(float(os.environ.get("TRAIN_PAUSE", "0.5")))
replace(os.environ["SPOT_WORKER_RESULT"], ("%d %s\n" % (epoch, hashlib.sha256(state).hexdigest())).encode())
