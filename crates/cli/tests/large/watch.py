# Waits for SIGTERM doing nothing else, and writes when it came
# (CLOCK_MONOTONIC, ns) to the file it is given: the time a signal reached
# an idle Python process.
import os, signal, sys, time

path = sys.argv[1]

def on_term(signum, frame):
    at = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    with open(path + ".tmp", "w") as f:
        f.write(str(at))
    os.replace(path + ".tmp", path)
    os._exit(0)

signal.signal(signal.SIGTERM, on_term)
with open(path + ".ready", "w") as f:
    f.write("ready")
while True:
    signal.pause()
