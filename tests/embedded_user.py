"""A process that uses the embedded Redis of a folder, driven line by line on stdin.

    python -m tests.embedded_user DIR

Connects with :func:`redcrawl.connection.connect` (no URL: the embedded server in DIR),
prints ``ready <pid of the server>``, then for each line on stdin:

* ``push N``: pushes N requests through the frontier and prints ``pushed <accepted>``;
* ``counts``: prints ``counts <accepted> <ready>``;
* ``exit``: returns normally (atexit hooks run, as at the end of ``scrapy crawl``).

Used by tests/test_connection.py to run several real users of one embedded server.
"""

from __future__ import annotations

import hashlib
import logging
import sys
import time
from pathlib import Path

from redcrawl.codec import Envelope
from redcrawl.connection import connect
from redcrawl.frontier import ListsFrontier
from redcrawl.settings import Settings


def main(directory: str) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    settings = Settings(embedded_dir=Path(directory))
    client = connect(settings)
    frontier = ListsFrontier(client, settings, "shared")
    pid = int(client.info("server")["process_id"])
    print(f"ready {pid}", flush=True)
    for line in sys.stdin:
        command, _, arg = line.strip().partition(" ")
        if command == "push":
            stamp = f"{time.time_ns()}"
            envelopes = [
                Envelope(
                    url=f"http://example.com/{stamp}/{i}",
                    fingerprint=hashlib.sha1(f"{stamp}/{i}".encode()).digest(),
                )
                for i in range(int(arg))
            ]
            print(f"pushed {frontier.push(envelopes).accepted}", flush=True)
        elif command == "counts":
            counts = frontier.counts()
            print(f"counts {counts.accepted} {counts.ready}", flush=True)
        elif command == "exit":
            break
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
