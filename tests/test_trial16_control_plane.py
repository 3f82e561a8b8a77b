"""Trial 16: seeing and running the fleet (``redcrawl serve``, ``/metrics``, the hosts
API) under realistic load, as an operator following the docs. Defects found, each a
failing test first (real uvicorn, real Redis 7)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator

import httpx
import pytest
import redis

from redcrawl.codec import Envelope
from redcrawl.frontier import open_frontier

from .apikit import AUTH_ADMIN, AUTH_READ, ApiServer, api_settings
from .conftest import RedisServer

DELAY = 30.0
"""A site delay long enough that nothing reopens during a test."""


@pytest.fixture(scope="module")
def api_server(redis7: RedisServer) -> Iterator[ApiServer]:
    client = redis.Redis.from_url(redis7.url)
    settings = api_settings(
        redis7.url,
        politeness_concurrency=1,
        politeness_delay=DELAY,
        politeness_randomize=False,
    )
    server = ApiServer(settings, client)
    yield server
    server.stop()
    client.close()


@pytest.fixture
def api(api_server: ApiServer, redis7_client: redis.Redis) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api_server.url, headers=AUTH_ADMIN, timeout=30) as c:
        yield c


def submit(api: httpx.Client, crawl: str, items: list[dict[str, object]]) -> None:
    r = api.post(f"/v1/crawls/{crawl}/requests", json={"requests": items})
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] == len(items), r.text


def metric(text: str, name: str, crawl: str) -> float:
    m = re.search(rf'^redcrawl_{name}\{{crawl="{re.escape(crawl)}"\}} (\S+)$', text, re.M)
    assert m, f"redcrawl_{name} of {crawl} not exported"
    return float(m.group(1))


# --- PUT .../hosts/{key} with a block_until before the epoch: 500 "corrupt state" ---------


@pytest.mark.parametrize("value", [-1, -0.5, -1e9])
def test_put_block_until_negative_is_a_422_naming_the_field_not_a_500(
    api: httpx.Client, value: float
) -> None:
    """docs/api.md: ``block_until`` is seconds since the epoch, at most a day back; "A
    bad value is 422 naming the field". A negative one answered 500 saying the crawl's
    stored state is corrupt (``OverflowError: cannot convert float infinity to
    integer``): the range check's message formats its upper bound, ``math.inf``, with
    ``int()`` (``hosts_records._num``). An operator told to purge a healthy crawl."""
    crawl = "t16-block-neg"
    submit(api, crawl, [{"url": "https://neg.example/a"}])
    r = api.put(f"/v1/crawls/{crawl}/hosts/neg.example", json={"block_until": value})
    assert r.status_code == 422, r.text
    assert [e["loc"] for e in r.json()["errors"]] == ["block_until"], r.text
    assert "cannot be read" not in r.text and "OverflowError" not in r.text
    shown = api.get(f"/v1/crawls/{crawl}/hosts/neg.example", headers=AUTH_READ).json()
    assert shown["block_until"] is None  # nothing was written


# --- /metrics: a site with ready work in several priority tiers counted once per tier -----


def _one_site_in_three_tiers(api: httpx.Client, crawl: str) -> None:
    """One site, three ready requests of priorities -1, 0 and 1 (one per ready tier of
    the default 3), its delay DELAY: one of them may be leased now, not three."""
    submit(
        api,
        crawl,
        [
            {"url": "https://tiers.example/low", "priority": -1},
            {"url": "https://tiers.example/mid", "priority": 0},
            {"url": "https://tiers.example/high", "priority": 1},
        ],
    )
    d = api.get(f"/v1/crawls/{crawl}/hosts/tiers.example").json()
    assert d["ready_per_tier"] == [1, 1, 1], d  # (the premise: one request per tier)


def test_requests_leasable_counts_a_site_once_whatever_its_tiers(
    api: httpx.Client, api_server: ApiServer, redis7_client: redis.Redis
) -> None:
    """docs/metrics.md, "Leasable now": with politeness, each open site's ready queue is
    capped at what it may be granted at once (1 with a delay), "Exact while a tier has at
    most 20 open sites". One site with a delay and ready work in three tiers is 1
    leasable request (the lease step grants exactly one), but ``/metrics`` said 3: the
    estimate sums each tier's open zset (``SnapshotReader._open_queues``), so a site
    open in three tiers counts three times, and its queue in each tier is capped
    separately. The KEDA ScaledObject scales on this number: up to ``tiers`` times the
    workers the backlog can use."""
    crawl = "t16-leasable"
    _one_site_in_three_tiers(api, crawl)
    text = api.get("/metrics", headers=AUTH_READ).text
    leasable = metric(text, "requests_leasable", crawl)
    worker = open_frontier(redis7_client, api_server.settings, crawl)
    granted = worker.lease("w1", 10)
    assert len(granted) == 1  # (the truth: one request may be leased now)
    assert leasable == len(granted), (leasable, len(granted))


def test_politeness_keys_open_counts_sites_not_tier_entries(api: httpx.Client) -> None:
    """docs/metrics.md: ``redcrawl_politeness_keys_open`` is "sites (politeness keys) with
    ready work that may be served now" (and ``redcrawl top``'s title, "N open now", is the
    same number). One open site with ready work in three tiers read 3: the ``ZCOUNT`` of
    each tier's open zset, summed (``SnapshotReader._open_queues``). At 100,000 sites
    with three priorities, ``redcrawl top`` said "298,000 open now"."""
    crawl = "t16-open"
    _one_site_in_three_tiers(api, crawl)
    text = api.get("/metrics", headers=AUTH_READ).text
    assert metric(text, "politeness_keys_open", crawl) == 1


# --- GET .../hosts: one Lua step over 10,000 leased requests blocks Redis ----------------


def _monitor_args(line: bytes) -> tuple[str, list[bytes]]:
    """(client, arguments) of one MONITOR line: ``<time> [<db> <client>] "a" "b" ...``,
    each argument quoted as Redis's ``sdscatrepr`` writes it (``\\"``, ``\\\\``,
    ``\\xNN``, ``\\n``...)."""
    head, _, rest = line.partition(b"] ")
    client = head.partition(b" [")[2].partition(b" ")[2].decode()
    args: list[bytes] = []
    i = 0
    while i < len(rest):
        if rest[i : i + 1] != b'"':
            i += 1
            continue
        j, buf = i + 1, bytearray()
        while rest[j : j + 1] != b'"':
            if rest[j : j + 1] == b"\\":
                if rest[j + 1 : j + 2] == b"x":
                    buf.append(int(rest[j + 2 : j + 4], 16))
                    j += 4
                else:
                    buf += rest[j + 1 : j + 2]
                    j += 2
            else:
                buf += rest[j : j + 1]
                j += 1
        args.append(bytes(buf))
        i = j + 1
    return client, args


def test_hosts_list_reads_a_bounded_number_of_records_per_redis_step(
    api: httpx.Client, api_server: ApiServer, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """Trial 16, scenario 1: 300,000 requests over 100,000 sites, 10,000 in flight (50
    workers): each ``GET /v1/crawls/{crawl}/hosts`` (and each dashboard crawl page, every
    10 s per open tab, and ``redcrawl top``'s hosts panel, every 5 s) ran
    ``hosts_list.lua``, one Lua step that reads the records of up to
    ``LIST_LEASED_IDS`` = 10,000 leased requests: 58 to 85 ms of Redis CPU in one
    atomic step (SLOWLOG 61 to 85 ms) during which every worker's lease and ack waits;
    at 1,000 in flight the same step took 9 ms. The module's own rule is "short commands,
    pipelined (never one long script)". Counted here, not timed: the request records one
    script step reads (MONITOR shows the commands a script runs), at most 1,000 per
    step, whatever the number of requests in flight."""
    crawl = "t16-inflight"
    n = 10_000
    worker = open_frontier(redis7_client, api_server.settings, crawl)
    urls = [f"https://s{i}.example/p" for i in range(n)]
    for at in range(0, n, 1000):  # (as the scheduler pushes them)
        chunk = urls[at : at + 1000]
        worker.push([Envelope(url=u, fingerprint=hashlib.sha1(u.encode()).digest()) for u in chunk])
    held = sum(len(worker.lease(f"w{i}", 1000, ttl=600)) for i in range(10))
    assert held == n  # (one per site: their delay holds the rest)
    req_key = worker.keys.req.encode()  # (the hash of the crawl's request records)

    mon = redis.Redis.from_url(redis7.url).monitor()
    with mon:
        r = api.get(f"/v1/crawls/{crawl}/hosts", params={"limit": 20}, headers=AUTH_READ)
        assert r.status_code == 200, r.text
        redis7_client.echo("t16-end-of-request")
        per_step: list[int] = []  # records read by each script step
        while True:
            line = mon.connection.read_response()
            assert isinstance(line, bytes)
            client, args = _monitor_args(line)
            if [a.lower() for a in args[:2]] == [b"echo", b"t16-end-of-request"]:
                break
            if args and args[0].lower() in (b"evalsha", b"eval"):
                per_step.append(0)
            elif (
                client == "lua"
                and per_step
                and args[:2] in ([b"HMGET", req_key], [b"hmget", req_key])
            ):
                per_step[-1] += len(args) - 2
    assert r.json()["hosts"], r.text
    assert per_step and max(per_step) <= 1000, per_step


# --- the dashboard's "requeue all N" button requeues 1,000 of them -----------------------


def test_dashboard_requeue_all_requeues_every_dead_letter_it_names(
    api: httpx.Client, api_server: ApiServer, redis7_client: redis.Redis
) -> None:
    """docs/dashboard.md: a crawl's page has a **requeue all** button under its dead
    letters; it reads "requeue all 1,100" for 1,100 of them. Pressed, it requeued 1,000
    (``FrontierCore.requeue_dead``'s default ``limit``) and left 100 dead, with the
    button now reading "requeue all 100". The button says all; it should requeue all (in
    bounded steps), or say how many it will take."""
    crawl = "t16-requeue-all"
    n = 1100
    items: list[dict[str, object]] = [{"url": f"https://d{i}.example/p"} for i in range(n)]
    for at in range(0, n, 10):
        submit(api, crawl, items[at : at + 10])
    worker = open_frontier(redis7_client, api_server.settings, crawl)
    leases = [lease for i in range(2) for lease in worker.lease(f"w{i}", 1000)]
    assert len(leases) == n
    for lease in leases:
        assert worker.dead_letter(lease, "HTTP 500") == "dead"

    page = api.get(f"/crawls/{crawl}", params={"refresh": 0}).text
    assert f"requeue all {n:,}" in page
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found
    r = api.post(f"/crawls/{crawl}/requeue", data={"csrf": found.group(1)})
    assert r.status_code == 303, r.text
    after = api.get(f"/v1/crawls/{crawl}").json()
    assert (after["dead"], after["requeued"]) == (0, n), after


# --- a crawl purged elsewhere and made again with another layout: the API's stale frontier


def test_a_crawl_purged_elsewhere_and_recreated_is_read_with_its_new_layout(
    api: httpx.Client, api_server: ApiServer, redis7_client: redis.Redis
) -> None:
    """docs/api.md: "an existing crawl is always served with the backend (and shard count
    or ordering) it was created with". ``redcrawl serve`` keeps each crawl's frontier
    (``Context.frontier``, an ``lru_cache``; the snapshot reader of ``/metrics`` its own
    dict), opened with the layout it read the first time. A purge made elsewhere
    (``redcrawl purge``, another API process behind the balancer, a
    ``SCHEDULER_PERSIST = False`` crawl removing itself) does not reach that cache, so a
    crawl made again with another layout (here: the streams backend) was still read as
    the old lists crawl: requests in flight 0 while 2 were leased (the conservation law
    broken: ready + in flight != accepted), ``…/shards`` 409 "lists backend", and
    ``/metrics`` the same stale numbers."""
    crawl = "t16-relayout"
    settings = api_server.settings
    lists = open_frontier(redis7_client, settings, crawl)
    submit(api, crawl, [{"url": "https://r0.example/first"}])
    assert api.get(f"/v1/crawls/{crawl}").json()["ready"] == 1  # (read: frontier kept)
    assert "t16-relayout" in api.get("/metrics").text

    lists.purge()  # what `redcrawl purge` does, from another process
    streams = open_frontier(redis7_client, settings.replace(backend="streams"), crawl)
    urls = [f"https://r{i}.example/p" for i in range(5)]
    streams.push([Envelope(url=u, fingerprint=hashlib.sha1(u.encode()).digest()) for u in urls])
    held = streams.lease("w1", 2, ttl=600)
    truth = streams.counts()
    assert (truth.ready, truth.in_flight, truth.accepted) == (5 - len(held), len(held), 5)

    d = api.get(f"/v1/crawls/{crawl}").json()
    assert (d["ready"], d["in_flight"], d["accepted"]) == (
        truth.ready,
        truth.in_flight,
        truth.accepted,
    ), d
    assert api.get(f"/v1/crawls/{crawl}/shards").status_code == 200
    text = api.get("/metrics").text
    m = re.search(rf'^redcrawl_requests\{{crawl="{crawl}",state="in_flight"\}} (\S+)$', text, re.M)
    assert m and float(m.group(1)) == truth.in_flight
