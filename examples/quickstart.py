"""Quickstart: the frontier on the embedded Redis, no Scrapy involved.

    python examples/quickstart.py

Pushes 2,000 URLs (with duplicates), then three worker threads lease, "fetch" and ack
them; one URL in 50 fails and is retried with backoff, a few always fail and end in the
dead-letter queue. The embedded Redis keeps its data in ./.redcrawl, so the crawl state
survives a restart; the example purges its crawl at the start.
"""

from __future__ import annotations

import hashlib
import threading

from redcrawl import Envelope, ListsFrontier, Settings, connect


def main() -> None:
    settings = Settings(lease_ttl=5.0, max_attempts=3, retry_backoff=0.05)
    client = connect(settings)  # no URL configured: starts the embedded Redis
    frontier = ListsFrontier(client, settings, "quickstart")
    frontier.purge()

    urls = [f"http://shop.local/item/{i % 1500}" for i in range(2000)]  # 500 duplicates
    result = frontier.push(
        [
            Envelope(
                url=u,
                priority=1 if u.endswith("7") else 0,
                fingerprint=hashlib.sha1(u.encode()).digest(),
            )
            for u in urls
        ]
    )
    print(f"pushed {len(urls)}: {result.accepted} accepted, {result.filtered} duplicates")

    def worker(name: str) -> None:
        while not frontier.counts().finished:
            leases = frontier.lease(name, 50)
            ok = []
            for lease in leases:
                n = int(lease.envelope.url.rsplit("/", 1)[1])
                if n % 500 == 13 or (n % 50 == 0 and lease.attempts == 1):
                    frontier.nack(lease, f"HTTP 503 from {lease.envelope.url}")
                else:
                    ok.append(lease)
            frontier.ack(ok)

    threads = [threading.Thread(target=worker, args=(f"worker-{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    c = frontier.counts()
    print(f"done {c.done}, dead {c.dead}, retried {c.retried}, still pending {c.pending}")
    print(
        f"conservation: accepted {c.accepted} = ready {c.ready} + delayed {c.delayed} + "
        f"in flight {c.in_flight} + done {c.done} + dead {c.dead}: {c.conserved}"
    )
    for d in frontier.dead():
        print(f"  dead: {d.url} after {d.attempts} attempts: {d.error}")


if __name__ == "__main__":
    main()
