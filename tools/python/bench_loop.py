"""The Python baseline of benches/throughput.rs: drain a queue with the
azure-storage-queue SDK the way a hand-written Python worker does (receive
32, "handle" each message trivially, delete it), and report how long it took.

Usage (the connection string comes from AZURE_STORAGE_CONNECTION_STRING, so
it never appears in a process listing):
  bench_loop.py QUEUE COUNT MODE TIMEOUT_SECS
    MODE sequential: delete the batch's messages one after the other (the
                     loop of the SDK's samples)
    MODE threads:    delete them concurrently on a pool of 32 threads sharing
                     one connection pool of 32 (the sync SDK's only way to
                     overlap requests)

It stops once COUNT messages are deleted (the queue was filled with exactly
COUNT) and prints one JSON object: seconds from the first receive to the last
delete, messages deleted, receive calls, and the CPU seconds this process
spent in that window (user + system). Exits non-zero after TIMEOUT_SECS.
"""

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import requests
from azure.core.pipeline.transport import RequestsTransport
from azure.storage.queue import QueueClient

BATCH = 32
VISIBILITY_SECS = 30


def client(queue, pool_size):
    session = requests.Session()
    adapter = requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=pool_size)
    session.mount("http://", adapter)
    return QueueClient.from_connection_string(
        os.environ["AZURE_STORAGE_CONNECTION_STRING"],
        queue,
        transport=RequestsTransport(session=session, session_owner=False),
        retry_total=2,
        connection_timeout=5,
        read_timeout=30,
    )


def main():
    queue, count, mode, timeout = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    if mode not in ("sequential", "threads"):
        sys.exit(f"unknown mode {mode!r}")
    pool = ThreadPoolExecutor(BATCH) if mode == "threads" else None
    q = client(queue, BATCH if pool else 1)
    deadline = time.monotonic() + timeout
    deleted = receives = 0
    cpu_start = os.times()
    start = time.monotonic()
    while deleted < count:
        if time.monotonic() > deadline:
            sys.exit(f"timed out after {timeout} s with {deleted} of {count} deleted")
        batch = list(
            q.receive_messages(
                messages_per_page=BATCH, max_messages=BATCH, visibility_timeout=VISIBILITY_SECS
            )
        )
        receives += 1
        if pool:
            list(pool.map(q.delete_message, batch))
        else:
            for message in batch:
                q.delete_message(message)
        deleted += len(batch)
    elapsed = time.monotonic() - start
    cpu_end = os.times()
    cpu = (cpu_end.user - cpu_start.user) + (cpu_end.system - cpu_start.system)
    if pool:
        pool.shutdown()
    print(json.dumps({"seconds": elapsed, "deleted": deleted, "receives": receives, "cpu_seconds": cpu}))


if __name__ == "__main__":
    main()
