"""Migrating an unfinished scrapy-redis crawl: its queue and dupefilter move to redcrawl.

The end-to-end tests run tests/scrapy_projects/srproj on the real scrapy-redis 0.9.1,
stopped partway (CLOSESPIDER_PAGECOUNT), so its queue and dupefilter are real; migrate
them with :func:`redcrawl.migrate.import_scrapy_redis`; then run the same project with
only the class paths changed on redcrawl, and check with the site's own hit counts that
exactly the pages scrapy-redis had not fetched are fetched, nothing twice. The other
tests feed the importer hostile and odd queue entries.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import cast
from urllib.parse import urlsplit

import pytest
import redis
import typer
from scrapy import Request, Spider
from scrapy.http import FormRequest, JsonRequest
from scrapy_redis import picklecompat
from scrapy_redis.dupefilter import RFPDupeFilter
from typer.testing import CliRunner

from redcrawl import codec
from redcrawl.demo import ShopSite, SiteConfig
from redcrawl.errors import ConfigError
from redcrawl.fingerprint import MODE_FIELD, crawl_fingerprint_mode, fingerprint
from redcrawl.frontier import FrontierCore, open_frontier
from redcrawl.keys import CrawlKeys
from redcrawl.migrate import (
    RefusedEntry,
    RequestUnpickler,
    import_scrapy_redis,
    request_dict_to_envelope,
    unpickle_request_dict,
)
from redcrawl.settings import Ordering, Settings
from tests.conftest import RedisServer, raw
from tests.scrapy_projects.harness import HERE, Worker, clean_env

PROJECT = HERE / "srproj"
SITE = SiteConfig(products=60, per_page=6, categories=3, tracking_params=False)
QUEUES: dict[str, Ordering] = {
    "scrapy_redis.queue.PriorityQueue": "priority",
    "scrapy_redis.queue.FifoQueue": "fifo",
    "scrapy_redis.queue.LifoQueue": "lifo",
}


def path_of(url: str) -> str:
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


def sr_fingerprint(url: str) -> str:
    """scrapy-redis's own fingerprint of a GET of ``url`` (hex, as in its dupefilter)."""
    return str(RFPDupeFilter(None, "k").request_fingerprint(Request(url)))


def migrated_copy(dst: Path) -> Path:
    """srproj with only the scheduler, dupefilter and spider base-class paths changed."""
    shutil.copytree(PROJECT, dst, ignore=shutil.ignore_patterns("__pycache__"))
    for path in dst.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        new = (
            text.replace('"scrapy_redis.scheduler.Scheduler"', '"redcrawl.scrapy.Scheduler"')
            .replace('"scrapy_redis.dupefilter.RFPDupeFilter"', '"redcrawl.scrapy.DupeFilter"')
            .replace("from scrapy_redis.spiders import", "from redcrawl.scrapy import")
        )
        path.write_text(new, encoding="utf-8")
    return dst


def scrapy_crawl(project: Path, redis_url: str, out: Path, *settings: str) -> Worker:
    cmd = [sys.executable, "-m", "scrapy", "crawl", "srspider"]
    for item in settings:
        cmd += ["-s", item]
    return Worker(
        cmd, out, cwd=project, env=clean_env(SRPROJ_REDIS_URL=redis_url, SRPROJ_REPORT=str(out))
    )


@pytest.mark.slow
@pytest.mark.parametrize("queue_class", list(QUEUES))
def test_unfinished_scrapy_redis_crawl_continues_on_redcrawl(
    queue_class: str, tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    with ShopSite(SITE) as site:
        pages, base = site.canonical_pages(), site.url
        # 1. scrapy-redis, stopped after 12 of the site's pages
        redis7_client.lpush("srspider:start_urls", site.url + "/")
        run = scrapy_crawl(
            PROJECT,
            redis7.url,
            tmp_path / "sr.json",
            f"SCHEDULER_QUEUE_CLASS={queue_class}",
            "CLOSESPIDER_PAGECOUNT=12",
        ).wait()
        assert run.returncode == 0, run.tail()
        assert run.report["reason"] == "closespider_pagecount", run.tail()
        fetched = Counter(site.hits())
        queue_kind = "zset" if QUEUES[queue_class] == "priority" else "list"
        assert redis7_client.type("srspider:requests") == queue_kind.encode()
        entries = raw(
            cast("list[bytes]", redis7_client.zrange("srspider:requests", 0, -1))
            if queue_kind == "zset"
            else redis7_client.lrange("srspider:requests", 0, -1)
        )
        queued = Counter(path_of(pickle.loads(entry)["url"]) for entry in entries)
        members = {m.decode() for m in raw(redis7_client.smembers("srspider:dupefilter"))}
        assert queued and members and sum(fetched.values()) >= 12
        # scrapy-redis's dupefilter holds the queued requests too, and its fingerprints
        # are redcrawl's in scrapy-redis mode (not Scrapy's)
        for path in queued:
            assert sr_fingerprint(site.url + path) in members
            assert fingerprint(site.url + path, mode="scrapy-redis").hex() == sr_fingerprint(
                site.url + path
            )
            assert fingerprint(site.url + path).hex() not in members
        # pages scrapy-redis took from its queue but had not fetched when it stopped:
        # lost by scrapy-redis itself (nothing can tell them from fetched ones)
        lost = {
            p
            for p in pages
            if sr_fingerprint(site.url + p) in members and p not in fetched and p not in queued
        }

        # 2. migrate into the crawl the project's workers will open (same ordering)
        frontier = open_frontier(redis7_client, Settings(ordering=QUEUES[queue_class]), "srspider")
        result = import_scrapy_redis(
            redis7_client, frontier, "srspider", queue_class=queue_class, batch=7
        )
        assert (result.queue_read, result.pushed, result.refused, result.unstorable) == (
            sum(queued.values()),
            sum(queued.values()),
            0,
            0,
        )
        assert result.queued_members == len(
            {p for p in queued if sr_fingerprint(site.url + p) in members}
        )
        assert result.done_added + result.queued_members == len(members)
        assert not result.source_changed
        assert frontier.counts().ready == sum(queued.values())
        assert redis7_client.hget(frontier.keys.control, MODE_FIELD) == b"scrapy-redis"

        # 3. the project with only the class paths changed, on redcrawl
        site.reset_hits()
        project = migrated_copy(tmp_path / "migrated")
        run2 = scrapy_crawl(
            project, redis7.url, tmp_path / "rc.json", f"SCHEDULER_QUEUE_CLASS={queue_class}"
        ).wait(timeout=120)
        assert run2.returncode == 0, run2.tail()
        assert not run2.report["scrapy_redis_loaded"]
        second = Counter(site.hits())

    # exactly what scrapy-redis had not fetched: its queue, and the pages it had never
    # seen; nothing it had fetched (or taken from its queue) is fetched again
    never_seen = {p for p in pages if sr_fingerprint(base + p) not in members}
    expected = queued + Counter(never_seen - set(queued))
    assert second == expected, (
        sorted((second - expected).items()),
        sorted((expected - second).items()),
    )
    # every page of the site fetched in the two runs, but the ones scrapy-redis lost
    assert set(fetched) | set(second) == pages - lost
    assert len(lost) <= 1  # CONCURRENT_REQUESTS = 1: at most the one it held
    c = open_frontier(redis7_client, Settings(ordering=QUEUES[queue_class]), "srspider").counts()
    assert c.finished and c.conserved and c.done == sum(expected.values())


# --- the importer on hand-made queues --------------------------------------------------------


class SpiderWithCallbacks(Spider):
    name = "srspider"

    def parse(self, response: object) -> None: ...

    def parse_item(self, response: object) -> None: ...

    def on_error(self, failure: object) -> None: ...


SPIDER = SpiderWithCallbacks()


def sr_entry(request: Request) -> bytes:
    """A queue entry as scrapy-redis 0.9.1 writes it (queue.Base._encode_request)."""
    return bytes(picklecompat.dumps(request.to_dict(spider=SPIDER)))


class Touch:
    """A pickle whose loading would run a shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


REQUESTS = [
    Request(
        "http://a.example/x?b=1&a=2", meta={"depth": 2, "link_text": "hi", "rule": 0}, priority=3
    ),
    Request(
        "http://a.example/y",
        callback=SPIDER.parse_item,
        errback=SPIDER.on_error,
        cb_kwargs={"k": [1, 2]},
        headers={"X-Token": "y"},
        cookies={"c": "d"},
        flags=["f"],
        method="POST",
        body=b"xx",
    ),
    Request("http://a.example/again", dont_filter=True),
    FormRequest("http://a.example/form", formdata={"a": "b"}),
    JsonRequest("http://a.example/json", data={"a": 1}),
]


def test_real_scrapy_redis_entries_need_no_class(tmp_path: Path) -> None:
    """What the unpickler accepts was measured, not guessed: scrapy-redis's own pickles of
    Request, FormRequest and JsonRequest dicts name no global at all."""
    for request in REQUESTS:
        entry = sr_entry(request)
        assert unpickle_request_dict(entry) == pickle.loads(entry)
        env = request_dict_to_envelope(unpickle_request_dict(entry))
        rebuilt = codec.to_request(codec.decode(codec.encode(env)), SPIDER)
        assert rebuilt.to_dict(spider=SPIDER) == request.to_dict(spider=SPIDER)


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(lambda m: Touch(m), id="reduce-os-system"),
        pytest.param(
            lambda m: {"url": "http://a.example/", "meta": {"x": Touch(m)}}, id="reduce-inside-meta"
        ),
        pytest.param(
            lambda m: {
                "url": "http://a.example/",
                "meta": {"when": __import__("datetime").datetime(2024, 1, 1)},
            },
            id="object-in-meta",
        ),
    ],
)
def test_unpickler_refuses_globals_without_running_them(payload: object, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    data = pickle.dumps(payload(marker), protocol=pickle.HIGHEST_PROTOCOL)  # type: ignore[operator]
    with pytest.raises(RefusedEntry, match="refused: the entry needs"):
        unpickle_request_dict(data)
    for protocol in range(0, pickle.HIGHEST_PROTOCOL + 1):
        with pytest.raises(RefusedEntry):
            unpickle_request_dict(pickle.dumps(payload(marker), protocol=protocol))  # type: ignore[operator]
    with pytest.raises(pickle.UnpicklingError):
        RequestUnpickler(io.BytesIO(data)).load()
    assert not marker.exists()


def lxml_string(text: str) -> str:
    """What a CrawlSpider's link extractor puts in meta["link_text"]: lxml's string."""
    from lxml import etree

    value = etree.XPath("string()")(etree.fromstring(f"<a>{text}</a>"))
    assert type(value).__name__ == "_ElementUnicodeResult"
    return cast("str", value)


# a str subclass as protocols 0 and 1 would store it: copyreg._reconstructor(cls, str, s)
RECONSTRUCTOR_P0 = (
    b"(dp0\nVurl\np1\nVhttp://a.example/\np2\nsVmeta\np3\n(dp4\nVlink_text\np5\n"
    b"ccopy_reg\n_reconstructor\np6\n(clxml.etree\n_ElementUnicodeResult\np7\n"
    b"c__builtin__\nstr\np8\nVCat 1\np9\ntp10\nRp11\nss."
)


@pytest.mark.parametrize("protocol", range(2, pickle.HIGHEST_PROTOCOL + 1))
def test_lxml_string_in_meta_is_read_as_a_plain_str(protocol: int) -> None:
    """A CrawlSpider's requests carry lxml's string in meta["link_text"]; pickle (2..5:
    0 and 1 cannot pickle it) names its class: NEWOBJ(lxml.etree._ElementUnicodeResult,
    ("text",)). It is read as the plain str, not the subclass (nothing of lxml imported)."""
    request = Request("http://a.example/c", meta={"rule": 0, "link_text": lxml_string("Cat 1")})
    d = request.to_dict(spider=SPIDER)
    if protocol == 2:  # pickles bytes (the body) through _codecs.encode: not read
        del d["body"]
    data = pickle.dumps(d, protocol=protocol)
    assert b"_ElementUnicodeResult" in data
    d = unpickle_request_dict(data)
    assert d["meta"] == {"rule": 0, "link_text": "Cat 1"}
    assert type(d["meta"]["link_text"]) is str
    # the same with copyreg._reconstructor (protocols 0, 1), and an empty link text
    d = unpickle_request_dict(RECONSTRUCTOR_P0)
    assert d["meta"] == {"link_text": "Cat 1"} and type(d["meta"]["link_text"]) is str
    empty = pickle.dumps({"url": "http://a.example/", "t": lxml_string("")}, protocol=protocol)
    assert unpickle_request_dict(empty)["t"] == ""


class MyStr(str):
    """A str subclass of a project: its name does not say it is a str (refused)."""


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(
            pickle.dumps({"url": "http://a.example/", "t": MyStr("x")}, protocol=p),
            id=f"other-str-subclass-p{p}",
        )
        for p in range(pickle.HIGHEST_PROTOCOL + 1)
    ]
    + [
        # the stand-ins take one plain string, nothing else
        pytest.param(
            b"\x80\x02clxml.etree\n_ElementUnicodeResult\n]\x85\x81.", id="newobj-of-a-list"
        ),
        pytest.param(
            b"\x80\x02clxml.etree\n_ElementUnicodeResult\nX\x01\x00\x00\x00aX\x01\x00\x00\x00b\x86\x81.",
            id="newobj-of-two-strings",
        ),
        pytest.param(b"\x80\x02c__builtin__\nstr\nC\x01x\x85R.", id="str-of-bytes"),
        pytest.param(
            RECONSTRUCTOR_P0.replace(b"clxml.etree\n_ElementUnicodeResult", b"c__main__\nMyStr"),
            id="reconstructor-of-another-class",
        ),
        pytest.param(
            RECONSTRUCTOR_P0.replace(b"c__builtin__\nstr", b"c__builtin__\nobject"),
            id="reconstructor-of-another-base",
        ),
        pytest.param(
            RECONSTRUCTOR_P0.replace(b"VCat 1\np9\n", b"(lp9\n"), id="reconstructor-of-a-list"
        ),
        pytest.param(b"\x80\x02ccopyreg\n__newobj__\n.", id="copyreg-newobj"),
    ],
)
def test_str_stand_ins_take_only_their_shape(data: bytes) -> None:
    with pytest.raises(RefusedEntry, match="refused"):
        unpickle_request_dict(data)


def test_extension_registry_is_refused_too(tmp_path: Path) -> None:
    """EXT opcodes name a global through copyreg's registry: they go through find_class."""
    import copyreg

    marker = tmp_path / "pwned"
    command = f"touch {marker}".encode()
    data = b"\x80\x02\x82\xf0X" + len(command).to_bytes(4, "little") + command + b"\x85R."
    copyreg.add_extension(os.system.__module__, "system", 240)
    try:
        with pytest.raises(RefusedEntry, match="system"):
            unpickle_request_dict(data)
    finally:
        copyreg.remove_extension(os.system.__module__, "system", 240)
    assert not marker.exists()


@pytest.mark.parametrize(
    "data, reason",
    [
        (pickle.dumps(["http://a.example/"]), "not a request dict"),
        (pickle.dumps({"meta": {}}), "no 'url'"),
        (b"not a pickle", "not a readable pickle"),
        (pickle.dumps({"url": "http://a.example/", "headers": "x"}), "'headers' is a str"),
        (pickle.dumps({"url": "http://a.example/", "what": 1}), "unknown request fields"),
    ],
)
def test_entries_that_are_not_request_dicts_are_refused(data: bytes, reason: str) -> None:
    with pytest.raises(RefusedEntry, match=reason):
        request_dict_to_envelope(unpickle_request_dict(data))


def frontier_of(client: redis.Redis, crawl: str = "srspider", **settings: object) -> FrontierCore:
    return open_frontier(client, Settings(**settings), crawl)  # type: ignore[arg-type]


def test_malicious_queue_entry_is_counted_and_never_run(
    tmp_path: Path, redis_client: redis.Redis
) -> None:
    marker = tmp_path / "pwned"
    good = sr_entry(REQUESTS[0])
    redis_client.zadd(
        "srspider:requests", {good: -3, pickle.dumps(Touch(marker)): 0, b"\x80\x05garbage": 0}
    )
    frontier = frontier_of(redis_client)
    # any entry refused: nothing is written (the dupefilter would mark its page done)
    stopped = import_scrapy_redis(redis_client, frontier, "srspider")
    assert (stopped.stopped, stopped.queue_read, stopped.refused) == (True, 3, 2)
    assert not redis_client.keys("rc:*")
    assert any("--partial" in w for w in stopped.warnings)
    result = import_scrapy_redis(redis_client, frontier, "srspider", partial=True)
    assert not marker.exists()
    assert (result.queue_read, result.pushed, result.refused) == (3, 1, 2)
    assert any("posix.system" in e or "os.system" in e for e in result.examples)
    assert any("stay in the scrapy-redis queue" in w for w in result.warnings)
    [lease] = frontier.lease("w", 10)
    assert lease.envelope.url == "http://a.example/x?b=1&a=2"
    assert lease.envelope.meta == {"depth": 2, "link_text": "hi", "rule": 0}


def test_partial_import_keeps_pages_of_requests_it_could_read_out_of_done(
    redis_client: redis.Redis,
) -> None:
    """--partial: a request read but not imported (a field of the wrong type, a request
    class redcrawl does not allow) has a known fingerprint: its dupefilter member is not
    marked done, so its page is fetched when found again. An entry refused unread (a
    global) has none: its member is marked done (the loss --partial accepts)."""
    good, wrong, custom = (f"http://a.example/{n}" for n in ("good", "wrong", "custom"))
    entries = {
        sr_entry(Request(good)): 0,
        pickle.dumps({"url": wrong, "method": "GET", "headers": "x"}): 0,
        pickle.dumps({"url": custom, "method": "GET", "_class": "proj.http.MyRequest"}): 0,
        pickle.dumps({"url": "http://a.example/obj", "x": Touch(Path("/nonexistent/x"))}): 0,
    }
    redis_client.zadd("srspider:requests", entries)
    members = [sr_fingerprint(u) for u in (good, wrong, custom, "http://a.example/obj")]
    redis_client.sadd("srspider:dupefilter", *members)
    frontier = frontier_of(redis_client)
    result = import_scrapy_redis(redis_client, frontier, "srspider", partial=True)
    assert (result.pushed, result.refused + result.unstorable) == (1, 3), result.examples
    assert (result.queued_members, result.left_members, result.done_added) == (1, 2, 1)
    assert frontier.done.contains([bytes.fromhex(m) for m in members]) == [
        False,  # queued
        False,
        False,
        True,  # unread: marked done
    ]
    assert any("2 were kept out of the done import" in w for w in result.warnings)


def test_queue_kept_whole_callbacks_by_name_in_pop_order(redis_client: redis.Redis) -> None:
    """A FifoQueue (LPUSH, RPOP): every field kept, callbacks as names, pushed in the
    order scrapy-redis would have popped them; dont_filter requests without a
    fingerprint; the others with scrapy-redis's."""
    for request in REQUESTS:
        redis_client.lpush("srspider:requests", sr_entry(request))
    frontier = frontier_of(redis_client)
    result = import_scrapy_redis(redis_client, frontier, "srspider", batch=2)
    assert (result.queue_type, result.queue_order, result.pushed) == ("list", "fifo", 5)
    leases = frontier.lease("w", 10)
    assert [x.envelope.url for x in leases] == [r.url for r in REQUESTS]
    for lease, request in zip(leases, REQUESTS, strict=True):
        rebuilt = codec.to_request(lease.envelope, SPIDER)
        assert rebuilt.to_dict(spider=SPIDER) == request.to_dict(spider=SPIDER)
        if request.dont_filter:
            assert lease.id.startswith(b"#")
        else:  # the id of a request with a fingerprint is its fingerprint
            assert lease.id == bytes.fromhex(RFPDupeFilter(None, "k").request_fingerprint(request))
    assert leases[1].envelope.callback == "parse_item"
    assert leases[1].envelope.errback == "on_error"


def test_lifo_queue_pop_order(redis_client: redis.Redis) -> None:
    for request in REQUESTS[1:4]:  # one priority: the order is the queue's alone
        redis_client.lpush("srspider:requests", sr_entry(request))
    frontier = frontier_of(redis_client)
    import_scrapy_redis(
        redis_client, frontier, "srspider", queue_class="scrapy_redis.queue.LifoQueue"
    )
    assert [x.envelope.url for x in frontier.lease("w", 10)] == [r.url for r in REQUESTS[1:4]][::-1]


def test_dupefilter_members_of_queued_requests_stay_ready(redis_client: redis.Redis) -> None:
    queued = Request("http://a.example/queued")
    redis_client.zadd("srspider:requests", {sr_entry(queued): 0})
    done_urls = [f"http://a.example/done/{i}" for i in range(30)]
    redis_client.sadd(
        "srspider:dupefilter",
        sr_fingerprint(queued.url),
        *map(sr_fingerprint, done_urls),
        "not-hex",
    )
    frontier = frontier_of(redis_client)
    result = import_scrapy_redis(redis_client, frontier, "srspider", batch=4)
    assert (result.pushed, result.done_added, result.queued_members, result.invalid_members) == (
        1,
        30,
        1,
        1,
    )
    c = frontier.counts()
    assert c.ready == c.accepted == 1 and c.done == 0 and c.conserved
    # new requests of the crawl are fingerprinted as scrapy-redis did: the done ones
    # are duplicates, the queued one too (it is still queued), a new one is accepted
    envs = [
        codec.Envelope(url=u, fingerprint=fingerprint(u, mode="scrapy-redis"))
        for u in [*done_urls[:3], queued.url, "http://a.example/new"]
    ]
    assert frontier.push(envs).flags == (False, False, False, False, True)


def test_source_on_another_server(
    redis_client: redis.Redis,
    redis7_client: redis.Redis,
    redis_server: RedisServer,
    redis7: RedisServer,
) -> None:
    if redis_server.url == redis7.url:
        pytest.skip("needs two servers: runs with the 6.2 source")
    redis_client.zadd("srspider:requests", {sr_entry(REQUESTS[0]): -3})
    redis_client.sadd("srspider:dupefilter", sr_fingerprint("http://a.example/old"))
    frontier = frontier_of(redis7_client)
    result = import_scrapy_redis(redis_client, frontier, "srspider")
    assert (result.pushed, result.done_added) == (1, 1)
    assert frontier.counts().ready == 1
    assert redis_client.zcard("srspider:requests") == 1  # the source is only read


def test_custom_keys(redis_client: redis.Redis) -> None:
    redis_client.rpush("q:srspider", sr_entry(REQUESTS[0]))
    redis_client.sadd("df:srspider", sr_fingerprint("http://a.example/old"))
    result = import_scrapy_redis(
        redis_client,
        frontier_of(redis_client),
        "srspider",
        queue_key="q:%(spider)s",
        dupefilter_key="df:%(spider)s",
    )
    assert (result.queue_key, result.pushed, result.done_added) == ("q:srspider", 1, 1)


def test_refusals(redis_client: redis.Redis) -> None:
    with pytest.raises(ConfigError, match="neither"):
        import_scrapy_redis(redis_client, frontier_of(redis_client), "srspider")
    redis_client.zadd("srspider:requests", {sr_entry(REQUESTS[0]): 0})
    # a crawl already fingerprinted the Scrapy way
    other = frontier_of(redis_client, "busy")
    other.push(
        [codec.Envelope(url="http://a.example/", fingerprint=fingerprint("http://a.example/"))]
    )
    with pytest.raises(ConfigError, match="REDCRAWL_FINGERPRINTER"):
        import_scrapy_redis(redis_client, other, "srspider")
    with pytest.raises(ConfigError, match="REDCRAWL_CANONICALIZE"):
        import_scrapy_redis(redis_client, frontier_of(redis_client, canonicalize=True), "srspider")
    with pytest.raises(ConfigError, match="written by PriorityQueue"):
        import_scrapy_redis(
            redis_client,
            frontier_of(redis_client),
            "srspider",
            queue_class="scrapy_redis.queue.FifoQueue",
        )
    # a second import of the same queue, unless forced
    frontier = frontier_of(redis_client)
    assert import_scrapy_redis(redis_client, frontier, "srspider").pushed == 1
    with pytest.raises(ConfigError, match="--force"):
        import_scrapy_redis(redis_client, frontier, "srspider")
    again = import_scrapy_redis(redis_client, frontier, "srspider", force=True)
    assert (again.pushed, again.already_known) == (0, 1)
    migrations = json.loads(redis_client.hget(frontier.keys.control, "migrated-from") or "")
    assert list(migrations) == ["srspider:requests"]


def test_dry_run_writes_nothing(redis_client: redis.Redis) -> None:
    redis_client.zadd("srspider:requests", {sr_entry(REQUESTS[0]): 0})
    redis_client.sadd("srspider:dupefilter", sr_fingerprint("http://a.example/old"))
    before = sorted(redis_client.keys("*"))
    result = import_scrapy_redis(redis_client, frontier_of(redis_client), "srspider", dry_run=True)
    assert (result.pushed, result.done_added, result.dry_run) == (1, 1, True)
    assert sorted(redis_client.keys("*")) == before
    assert crawl_fingerprint_mode(redis_client, frontier_of(redis_client).keys) == "scrapy"


def test_a_dupefilter_without_a_queue_gets_no_queue_ordering_note(
    redis_client: redis.Redis,
) -> None:
    """A finished scrapy-redis crawl leaves only its dupefilter: no note about the
    ordering of a PriorityQueue that is not there (trial 9)."""
    redis_client.sadd("srspider:dupefilter", sr_fingerprint("http://a.example/old"))
    result = import_scrapy_redis(redis_client, frontier_of(redis_client), "srspider", dry_run=True)
    assert (result.queue_type, result.done_added) == ("none", 1)
    assert not any("PriorityQueue" in w for w in result.warnings), result.warnings


# --- the commands ------------------------------------------------------------------------


def cli_app() -> typer.Typer:
    """The ``redcrawl`` command."""
    from redcrawl.cli import app

    return app


def test_command(redis_client: redis.Redis, tmp_path: Path) -> None:
    url = redis_client.connection_pool.connection_kwargs
    redis_url = f"redis://{url['host']}:{url['port']}/0"
    for request in REQUESTS[:2]:
        redis_client.lpush("srspider:requests", sr_entry(request))
    redis_client.lpush("srspider:requests", pickle.dumps(Touch(tmp_path / "pwned")))
    redis_client.sadd("srspider:dupefilter", sr_fingerprint("http://a.example/old"))
    runner = CliRunner()
    args = ["import-scrapy-redis", "srspider", "--redis-url", redis_url, "--crawl", "moved"]
    dry = runner.invoke(cli_app(), [*args, "--dry-run"])
    assert dry.exit_code == 1, dry.output  # one entry refused
    assert "2 would be queued" in dry.output and "1 refused" in dry.output
    assert not redis_client.keys("rc:*")
    assert "unless --partial" in " ".join(dry.output.split())
    # an import that would leave a request behind writes nothing (before: it imported
    # the rest and marked every dupefilter member done, the refused request's page too)
    stopped = runner.invoke(cli_app(), args)
    assert stopped.exit_code == 1, stopped.output
    text = " ".join(stopped.output.split())
    assert "nothing imported" in text and "--partial" in text, text
    assert not redis_client.keys("rc:*")
    # --partial: the rest, the loss said
    done = runner.invoke(cli_app(), [*args, "--partial"])
    assert done.exit_code == 1, done.output
    assert "2 were queued" in done.output and "1 were marked done" in done.output
    text = " ".join(done.output.split())
    assert "1 queued request(s) were not imported" in text, text
    assert "stay in the scrapy-redis queue" in text, text
    assert not (tmp_path / "pwned").exists()
    assert frontier_of(redis_client, "moved").counts().ready == 2
    again = runner.invoke(cli_app(), args)
    assert again.exit_code == 2 and "--force" in again.output


def test_old_import_dupefilter_command_sets_the_mode_or_warns(redis_client: redis.Redis) -> None:
    from redcrawl.cli import app

    url = redis_client.connection_pool.connection_kwargs
    redis_url = f"redis://{url['host']}:{url['port']}/0"
    redis_client.sadd("srspider:dupefilter", sr_fingerprint("http://a.example/old"))
    runner = CliRunner()
    args = ["import-dupefilter", "srspider:dupefilter", "--redis-url", redis_url]
    # a new crawl: put in scrapy-redis mode, so the members match its requests
    result = runner.invoke(app, [*args, "--crawl", "fresh"])
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output
    assert redis_client.hget(CrawlKeys("fresh").control, MODE_FIELD) == b"scrapy-redis"
    f = frontier_of(redis_client, "fresh")
    assert (
        f.push(
            [
                codec.Envelope(
                    url="http://a.example/old",
                    fingerprint=fingerprint("http://a.example/old", mode="scrapy-redis"),
                )
            ]
        ).accepted
        == 0
    )
    # a crawl with Scrapy's fingerprints, and a queue left behind: both said
    busy = frontier_of(redis_client, "busy")
    busy.push(
        [codec.Envelope(url="http://a.example/", fingerprint=fingerprint("http://a.example/"))]
    )
    redis_client.zadd("srspider:requests", {sr_entry(REQUESTS[0]): 0})
    result = runner.invoke(app, [*args, "--crawl", "busy"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "will not match" in text and "import-scrapy-redis" in text
    assert "srspider:requests still holds queued requests" in text
