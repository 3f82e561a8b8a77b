"""A worker process for the SIGKILL test: lease, "process", ack, until the crawl is done.

``python -m tests.frontier_worker URL CRAWL WORKER LOGFILE [BACKEND [UNTIL_KEY]]``

With UNTIL_KEY the worker stops only once that Redis key exists (the producer is done)
and the crawl is finished.

Before acking a batch it logs ``P <id> <token>`` for each lease (the work was done), after
the ack returns ``A <acked> <batch size>``. Lines are flushed and fsynced, so after a
SIGKILL the log shows exactly what this worker had done (written lines are in the OS's
page cache, which a SIGKILL does not lose).
"""

from __future__ import annotations

import sys
import time

from redcrawl.connection import connect
from redcrawl.frontier import open_frontier
from redcrawl.settings import Settings
from tests.killkit import work_seconds


def main(
    url: str, crawl: str, worker: str, logfile: str, backend: str = "lists", until_key: str = ""
) -> None:
    settings = Settings(redis_url=url, lease_ttl=1.5, batch_size=50, backend=backend)  # type: ignore[arg-type]
    client = connect(settings)
    frontier = open_frontier(client, settings, crawl)
    with open(logfile, "a", buffering=1) as log:

        def write(line: str) -> None:
            log.write(line + "\n")
            log.flush()

        idle_since = None
        while True:
            leases = frontier.lease(worker, 50)
            if not leases:
                if frontier.counts().finished and (not until_key or client.exists(until_key)):
                    if idle_since is None:
                        idle_since = time.monotonic()
                    elif time.monotonic() - idle_since > 0.5:
                        break
                time.sleep(0.05)
                continue
            idle_since = None
            # the "work": most of the time a worker holds leases (tests/killkit.py)
            time.sleep(work_seconds(logfile))
            write("\n".join(f"P {x.id.hex()} {x.token}" for x in leases))
            write(f"A {frontier.ack(leases)} {len(leases)}")


if __name__ == "__main__":
    main(*sys.argv[1:7])
