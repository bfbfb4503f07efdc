"""Talks to a queue with the Python SDK (azure-storage-queue), for the Rust
interop tests in crates/azure/tests/it/python_interop.rs.

Usage (the connection string comes from AZURE_STORAGE_CONNECTION_STRING, so
it never appears in a process listing):
  interop.py send-base64 QUEUE TEXT...   enqueue each TEXT, base64-encoded
                                          (what Azure Functions/WebJobs send)
  interop.py receive-base64 QUEUE        print every visible message, decoded,
                                          as a JSON list, and delete them
  interop.py receive-text QUEUE          the same without decoding (the poison
                                          queue holds plain JSON text)
"""

import json
import os
import sys

from azure.core.exceptions import ResourceExistsError
from azure.storage.queue import QueueClient, TextBase64DecodePolicy, TextBase64EncodePolicy


def client(queue, base64=True):
    return QueueClient.from_connection_string(
        os.environ["AZURE_STORAGE_CONNECTION_STRING"],
        queue,
        message_encode_policy=TextBase64EncodePolicy() if base64 else None,
        message_decode_policy=TextBase64DecodePolicy() if base64 else None,
        # Fail fast: the Rust test bounds its own waits.
        retry_total=2,
        connection_timeout=5,
        read_timeout=10,
    )


def send_base64(queue, texts):
    q = client(queue)
    try:
        q.create_queue()
    except ResourceExistsError:
        pass
    ids = [q.send_message(text).id for text in texts]
    print(json.dumps(ids))


def receive(queue, base64):
    q = client(queue, base64)
    out = []
    # Bounded: at most 10 batches of 32.
    for _ in range(10):
        batch = list(q.receive_messages(messages_per_page=32, max_messages=32, visibility_timeout=30))
        if not batch:
            break
        for message in batch:
            out.append(
                {
                    "id": message.id,
                    "content": message.content,
                    "dequeue_count": message.dequeue_count,
                }
            )
            q.delete_message(message)
    print(json.dumps(out))


def main(argv):
    if len(argv) >= 3 and argv[0] == "send-base64":
        send_base64(argv[1], argv[2:])
    elif len(argv) == 2 and argv[0] == "receive-base64":
        receive(argv[1], base64=True)
    elif len(argv) == 2 and argv[0] == "receive-text":
        receive(argv[1], base64=False)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
