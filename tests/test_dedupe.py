"""The dedupe filters (exact, own Bloom, RedisBloom) on real Redis servers."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pytest
import redis
import scrapy
from redis.commands.bf.info import BFInfo

from redcrawl.codec import Envelope
from redcrawl.dedupe import BUCKET_FILL, DedupeSpec, Filter, exact_spec, resolve_spec, split
from redcrawl.errors import ConfigError, FrontierError
from redcrawl.fingerprint import fingerprint
from redcrawl.frontier import FrontierCore, ListsFrontier
from redcrawl.scrapy.dupefilter import DupeFilter
from redcrawl.settings import Settings

from .conftest import Clock, FrontierFactory, RedisServer


def fps(prefix: str, n: int, start: int = 0) -> list[bytes]:
    return [hashlib.sha1(f"{prefix}{i}".encode()).digest() for i in range(start, start + n)]


def env(url: str, dont_filter: bool = False) -> Envelope:
    return Envelope(
        url=url, dont_filter=dont_filter, fingerprint=hashlib.sha1(url.encode()).digest()
    )


def add_all(f: Filter, items: list[bytes], batch: int = 10_000) -> int:
    return sum(sum(f.add(items[i : i + batch])) for i in range(0, len(items), batch))


def count_present(f: Filter, items: list[bytes], batch: int = 10_000) -> int:
    return sum(sum(f.contains(items[i : i + batch])) for i in range(0, len(items), batch))


@pytest.fixture
def intset_limit(redis_client: redis.Redis) -> Iterator[None]:
    """Restore the server's set-max-intset-entries after a test changes it."""
    before = redis_client.config_get("set-max-intset-entries")["set-max-intset-entries"]
    assert before is not None
    yield
    redis_client.config_set("set-max-intset-entries", before)


# --- exact ------------------------------------------------------------------------------


def test_exact_million_urls_no_false_positive_no_false_negative(
    redis7_client: redis.Redis,
) -> None:
    spec = resolve_spec(Settings(dedupe_capacity=1_000_000))
    assert (spec.bucket_bits, spec.bucket_fill, spec.width_bits) == (12, BUCKET_FILL, 75)
    assert spec.intset_entries_needed == 512  # Redis's default: nothing to raise
    f = Filter(redis7_client, spec, "t:{c}:fpd")
    seen = fps("http://example.com/page/", 1_000_000)
    assert add_all(f, seen) == len(seen)  # all new, none collided
    assert add_all(f, seen[:50_000]) == 0  # and now all known
    assert count_present(f, seen) == len(seen)  # no false negative
    assert count_present(f, fps("http://example.com/other/", 1_000_000)) == 0
    assert redis7_client.get("t:{c}:fpd:n") == b"1000000"
    assert spec.level_of(1_000_000) == 0  # the capacity fits level 0
    per_url = f.memory() / len(seen)
    assert per_url <= 10, f"{per_url:.2f} bytes per URL"
    assert f.health() == []


def test_exact_stores_63_bit_integers_in_intset_buckets(redis_client: redis.Redis) -> None:
    spec = resolve_spec(Settings(dedupe_capacity=100_000))
    f = Filter(redis_client, spec, "t:{c}:fpd")
    f.configure()
    items = fps("u", 20_000)
    f.add(items)
    for fp in items[:50]:
        bucket, member = split(fp, spec.bucket_bits)
        assert 0 <= member < 2**63
        assert redis_client.sismember(f"t:{{c}}:fpd:{bucket}", str(member))
    keys = [k for k in f.redis_keys() if not k.endswith(b":n")]
    assert len(keys) == 2**spec.bucket_bits
    assert {redis_client.object("encoding", k) for k in keys} == {b"intset"}
    assert sum(redis_client.scard(k) for k in keys) == len(items)
    assert redis_client.get("t:{c}:fpd:n") == b"20000"  # the count that plans levels


@pytest.mark.parametrize(
    "value", [0, 1, 9_999_999, 10_000_000, 10**14 - 1, 10**14, 2**53 + 1, 2**63 - 1, 2**64 - 1]
)
def test_exact_member_is_the_exact_integer(redis7_client: redis.Redis, value: int) -> None:
    spec = resolve_spec(Settings(dedupe_capacity=100_000))
    fp = b"\x01\x02\x03" + b"\x00" * 5 + value.to_bytes(8, "big") + b"\xff" * 4
    bucket, member = split(fp, spec.bucket_bits)
    assert member == value & (2**63 - 1)
    Filter(redis7_client, spec, "t:{c}:fpd").add([fp])
    assert redis7_client.smembers(f"t:{{c}}:fpd:{bucket}") == {str(member).encode()}


def test_exact_detects_buckets_falling_back_to_hash_tables(
    redis_client: redis.Redis, intset_limit: None
) -> None:
    redis_client.config_set("set-max-intset-entries", 16)  # lowered below the default
    spec = resolve_spec(Settings(dedupe_capacity=100_000))  # 512 buckets of ~39 here
    f = Filter(redis_client, spec, "t:{c}:fpd")
    f.add(fps("u", 20_000))
    problems = f.health()
    assert len(problems) == 2, problems
    assert "set-max-intset-entries is 16" in problems[0]
    assert "no longer intsets" in problems[1]
    # configure() fixes the limit for buckets still to come
    assert f.configure() is None
    limit = redis_client.config_get("set-max-intset-entries")["set-max-intset-entries"]
    assert limit is not None and int(limit) == spec.intset_entries_needed
    assert len(f.health()) == 1  # the converted buckets stay hash tables


def test_exact_reports_when_the_server_refuses_config_set(
    redis_client: redis.Redis, redis_server: RedisServer, intset_limit: None
) -> None:
    redis_client.config_set("set-max-intset-entries", 16)
    redis_client.execute_command(
        "ACL", "SETUSER", "worker", "on", ">pw", "~*", "&*", "+@all", "-config"
    )
    try:
        limited = redis.Redis.from_url(redis_server.url.replace("://", "://worker:pw@"))
        f = Filter(limited, resolve_spec(Settings(dedupe_capacity=100_000)), "t:{c}:fpd")
        warning = f.configure()
        assert warning is not None and "set-max-intset-entries >= " in warning
        assert "refused" in warning
        f.add(fps("u", 20_000))
        # without CONFIG GET the sampled encodings still tell
        assert any("no longer intsets" in p for p in f.health())
    finally:
        redis_client.execute_command("ACL", "DELUSER", "worker")


def test_collision_probability_documented_values() -> None:
    spec = resolve_spec(Settings())  # the default capacity: 10^8
    assert spec.width_bits == 82
    assert spec.collision_probability(1e8) < 1.1e-9
    assert spec.collision_probability(1e10) < 1.1e-5
    # docs/dedupe.md's table
    table = {10**7: (15, 78), 10**8: (19, 82), 10**9: (22, 85), 10**10: (24, 87)}
    for capacity, (bits, width) in table.items():
        planned = resolve_spec(Settings(dedupe_capacity=capacity))
        assert (planned.bucket_bits, planned.width_bits) == (bits, width)


def test_legacy_plan_is_kept_only_for_crawls_created_with_it() -> None:
    settings = Settings(dedupe_capacity=10**8)
    legacy = exact_spec(10**8, legacy=True)
    assert legacy.encode() == "exact 16 0 0"  # what crawls were created with
    assert resolve_spec(settings, created="exact 16 0 0") == legacy
    assert resolve_spec(settings, created=None).encode() == "exact 19 0 0 320"
    assert resolve_spec(settings, created="exact 13 0 0") == resolve_spec(settings)


@pytest.mark.parametrize("value", [0, 9_999_999, 10**14, 2**63 - 1, 2**64 - 1])
def test_hinted_fingerprint_carries_the_member_and_bucket_lua_computes(value: int) -> None:
    spec = resolve_spec(Settings(dedupe_capacity=100_000))
    fp = b"\xfe\x02\x03" + b"\x00" * 5 + value.to_bytes(8, "big") + b"\xff" * 4
    bucket, member = split(fp, spec.bucket_bits)
    text = str(member).encode()
    key = b"rc:{c}:fpd:%d" % bucket  # no generations: the bucket as its key
    assert spec.hint(fp, b"rc:{c}:fpd") == fp + bytes([len(text)]) + text + key
    assert spec.hints(fp, b"rc:{c}:fpd") == (text, key)  # a push's last two fields
    assert spec.hint(b"#12", b"rc:{c}:fpd") == b"#12"  # not a fingerprint: as it is
    assert spec.hints(b"#12", b"rc:{c}:fpd") == (b"", b"")
    gens = resolve_spec(Settings(dedupe_capacity=100_000, recrawl_after=60.0))
    number = str(bucket).encode()  # generations: the bucket's number (the base varies)
    assert gens.hint(fp, b"rc:{c}:fpd") == fp + bytes([len(text)]) + text + number
    assert gens.hints(fp, b"rc:{c}:fpd") == (text, number)
    bloom = resolve_spec(Settings(dedupe="bloom", dedupe_capacity=1000, bloom_backend="lua"))
    assert bloom.hint(fp, b"rc:{c}:fpd") == fp
    assert bloom.hints(fp, b"rc:{c}:fpd") == (b"", b"")


def done_by_the_crawl(f: FrontierCore, urls: list[str]) -> None:
    """Push ``urls`` as a worker does (hinted), lease and ack them all; the filter then
    knows them by their bare fingerprints (split in Lua)."""
    assert f.push([env(u) for u in urls]).accepted == len(urls)
    while leases := f.lease("w", 100):
        f.ack(leases)
    items = [hashlib.sha1(u.encode()).digest() for u in urls]
    assert f.done.contains(items) == [True] * len(items)


@pytest.mark.parametrize("capacity", [100_000, 1_000])  # one call per bucket; grouped
def test_hinted_and_plain_fingerprints_meet_in_the_same_buckets(
    make_frontier: FrontierFactory, redis_client: redis.Redis, capacity: int
) -> None:
    """A worker sends each fingerprint with its member and bucket (push and ack); Lua
    computing them from the bare fingerprint (the Filter, an older worker's acks) must
    find the same: DONE through one is DONE through the other."""
    f = make_frontier(dedupe_capacity=capacity)
    urls = [f"http://a/{i}" for i in range(1_500)]
    done_by_the_crawl(f, urls)
    assert f.push([env(u) for u in urls]).accepted == 0  # hinted: same buckets
    others = [f"http://b/{i}" for i in range(300)]
    f.done.add([hashlib.sha1(u.encode()).digest() for u in others])
    assert f.push([env(u) for u in others]).accepted == 0
    f.push([env("http://c/1"), env("http://c/2")])
    held = f.lease("w", 2)
    raw = f._run(  # an older worker's ack: bare ids
        "settle",
        [0, len(held), 0, "", 1000, 3, "0", 10, b"n1", "", "", ""]
        + [x for h in held for x in (h.id, h.token)],
    )
    assert raw[1] == b"11"
    assert f.push([env("http://c/1"), env("http://c/2")]).accepted == 0
    assert f.counts().conserved


def test_hinted_fingerprints_with_generations_meet_the_filter(
    make_frontier: FrontierFactory, clock: Clock
) -> None:
    """With a recrawl window the client sends the bucket's number (the key depends on the
    generation), without one the bucket's key: either way a push and an ack find the
    buckets the Filter computes from the bare fingerprint."""
    f = make_frontier(dedupe_capacity=1_000_000, recrawl_after=3600.0)
    assert f.dedupe.gen_ms  # (a spec with generations; 2^12 buckets: one lookup each)
    urls = [f"http://g/{i}" for i in range(200)]
    done_by_the_crawl(f, urls)
    others = [f"http://h/{i}" for i in range(50)]
    f.done.add([hashlib.sha1(u.encode()).digest() for u in others])
    assert f.push([env(u) for u in others + urls]).accepted == 0  # hinted: same buckets
    assert f.counts().conserved


def test_exact_levels_beyond_capacity_with_generations(
    redis_client: redis.Redis, clock: Clock
) -> None:
    """Past the capacity, in a recrawl window's generations: each generation counts and
    grows its own levels; lookups read every level of every live generation."""
    spec = resolve_spec(Settings(dedupe_capacity=1_000, recrawl_after=3600.0))
    f = Filter(redis_client, spec, "t:{c}:fpd", clock=clock)
    first = fps("a", 40_000)
    assert add_all(f, first, batch=700) == len(first)  # crosses levels mid-batch
    clock.advance(spec.gen_ms / 1000)
    second = fps("b", 3_000)
    assert add_all(f, second, batch=1) == len(second)  # one at a time: the sparse path
    assert count_present(f, first + second) == len(first) + len(second)
    assert count_present(f, fps("c", 5_000)) == 0
    keys = [k for k in f.redis_keys() if not k.endswith(b":n")]
    assert {redis_client.object("encoding", k) for k in keys} == {b"intset"}
    assert max(redis_client.scard(k) for k in keys) < 512
    assert spec.level_of(40_000) == 3  # 5,120 + 10,240 + 20,480 + ...
    assert any(b":L3:" in k for k in keys) and not any(b":L4:" in k for k in keys)
    assert all(redis_client.pttl(k) > 0 for k in f.redis_keys())
    clock.advance(spec.gen_ms * (spec.gens + 1) / 1000)  # the first generation is gone
    assert count_present(f, first) == 0


# --- Bloom ------------------------------------------------------------------------------


def bloom(client: redis.Redis, capacity: int, backend: str = "lua", **kw: object) -> Filter:
    spec = resolve_spec(
        Settings(dedupe="bloom", dedupe_capacity=capacity, bloom_backend=backend, **kw),  # type: ignore[arg-type]
        client=client,
    )
    return Filter(client, spec, "t:{c}:fpd")


def test_own_bloom_fpr_and_size_at_capacity(redis7_client: redis.Redis) -> None:
    f = bloom(redis7_client, 200_000)
    assert f.spec.mode == "bloom"
    seen = fps("http://a/", 200_000)
    add_all(f, seen)
    assert count_present(f, seen) == len(seen)  # never a false negative
    fpr = count_present(f, fps("http://b/", 200_000)) / 200_000
    assert 0.008 <= fpr <= 0.012, fpr  # configured 1%, within 20%
    bits = sum(redis7_client.strlen(k) for k in f.redis_keys() if not k.endswith(b":n"))
    assert bits / len(seen) <= 1.2  # -ln(p)/ln(2)^2 bits per URL
    assert f.memory() / len(seen) <= 1.35  # plus what the allocator adds


def test_own_bloom_scales_with_layers_and_bounded_keys(redis_client: redis.Redis) -> None:
    spec = DedupeSpec("bloom", 20_000, 0.01, segment_bits=16)  # 8 KiB keys
    f = Filter(redis_client, spec, "t:{c}:fpd")
    seen = fps("http://a/", 100_000)  # 5x the first layer's capacity
    add_all(f, seen, batch=5_000)
    assert count_present(f, seen) == len(seen)
    fpr = count_present(f, fps("http://b/", 100_000)) / 100_000
    assert fpr < 0.02, fpr  # layers keep it below 2p
    keys = f.redis_keys()
    assert len({k.split(b":")[3] for k in keys if not k.endswith(b":n")}) == 3  # layers 0-2
    assert max(redis_client.strlen(k) for k in keys if not k.endswith(b":n")) <= 2**16 // 8


def test_auto_backend_without_redisbloom_is_own_bloom(redis7_client: redis.Redis) -> None:
    assert resolve_spec(Settings(dedupe="bloom"), client=redis7_client).mode == "bloom"
    with pytest.raises(ConfigError, match="REDCRAWL_BLOOM_BACKEND"):
        resolve_spec(Settings(dedupe="bloom", bloom_backend="redisbloom"), client=redis7_client)


def test_redisbloom_backend(redisbloom: RedisServer) -> None:
    client = redis.Redis.from_url(redisbloom.url)
    client.flushall()
    f = bloom(client, 100_000, backend="auto")
    assert f.spec.mode == "rbloom"
    seen = fps("http://a/", 100_000)
    add_all(f, seen)
    assert count_present(f, seen) == len(seen)
    fpr = count_present(f, fps("http://b/", 100_000)) / 100_000
    assert fpr <= 0.012, fpr
    [key] = f.redis_keys()
    info = client.bf().info(key)
    assert isinstance(info, BFInfo)
    assert info.insertedNum is not None and info.capacity is not None
    assert 0.95 * len(seen) <= info.insertedNum <= len(seen)
    assert info.capacity >= len(seen)


def test_frontier_on_redisbloom_keeps_its_backend(redisbloom: RedisServer) -> None:
    client = redis.Redis.from_url(redisbloom.url)
    client.flushall()
    own = ListsFrontier(client, Settings(dedupe="bloom", bloom_backend="lua"), "c1")
    own.push([env("http://a/1")])
    again = ListsFrontier(client, Settings(dedupe="bloom"), "c1")
    assert again.dedupe.mode == "bloom"  # created with own Bloom: stays
    fresh = ListsFrontier(client, Settings(dedupe="bloom"), "c2")
    assert fresh.dedupe.mode == "rbloom"
    fresh.push([env("http://a/1"), env("http://a/2")])
    fresh.ack(fresh.lease("w", 10))
    assert fresh.push([env("http://a/1"), env("http://a/3")]).flags == (False, True)
    assert fresh.done.contains([env("http://a/2").fingerprint or b""]) == [True]


# --- the frontier with each filter ------------------------------------------------------

MODES = [
    pytest.param({"dedupe": "exact"}, id="exact"),
    pytest.param({"dedupe": "bloom", "bloom_backend": "lua"}, id="bloom"),
]


@pytest.mark.parametrize("mode", MODES)
def test_done_filters_and_recrawl_bypasses_it(
    make_frontier: FrontierFactory, mode: dict[str, str]
) -> None:
    f = make_frontier(**mode, dedupe_capacity=10_000)
    f.push([env("http://a/1"), env("http://a/2")])
    f.ack(f.lease("w", 1))
    assert f.push([env("http://a/1"), env("http://a/2")]).accepted == 0  # done, queued
    r = f.push([env("http://a/1"), env("http://a/2")], recrawl=True)
    assert r.flags == (True, False)  # queued still counts
    assert f.push([env("http://a/1", dont_filter=True)]).accepted == 1
    assert f.counts().conserved


@pytest.mark.parametrize("mode", MODES)
def test_recrawl_window_expires_done_fingerprints(
    make_frontier: FrontierFactory, clock: Clock, redis_client: redis.Redis, mode: dict[str, str]
) -> None:
    window = 7 * 24 * 3600.0
    f = make_frontier(**mode, dedupe_capacity=10_000, recrawl_after=window)
    f.push([env("http://a/1")])
    f.ack(f.lease("w", 1))
    for key in f.done.redis_keys():  # whole keys expire, no scans
        assert redis_client.pttl(key) > 0
    assert not any("no longer intsets" in p for p in f.done.health())  # current generation
    clock.advance(window * 0.99)
    assert f.push([env("http://a/1")]).accepted == 0
    clock.advance(window * 0.27)  # past W * (1 + 1/4)
    assert f.push([env("http://a/1")]).accepted == 1
    f.ack(f.lease("w", 1))
    assert f.push([env("http://a/1")]).accepted == 0  # done again, in a new generation


def test_a_crawl_keeps_its_dedupe_layout(make_frontier: FrontierFactory) -> None:
    make_frontier(dedupe="exact").push([env("http://a/1")])
    other = make_frontier(dedupe="bloom", bloom_backend="lua")
    with pytest.raises(FrontierError, match="REDCRAWL_DEDUPE"):
        other.push([env("http://a/2")])


# --- the standalone DupeFilter (another scheduler) ----------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_standalone_dupefilter_with_version_meta(
    redis7: RedisServer, redis7_client: redis.Redis, mode: dict[str, str]
) -> None:
    settings = Settings(
        redis_url=redis7.url,
        crawl="df",
        fingerprint_version_meta="v",
        dedupe_capacity=10_000,
        **mode,  # type: ignore[arg-type]
    )
    frontier = ListsFrontier(redis7_client, settings, "df")
    frontier.push([Envelope(url="http://a/done", fingerprint=fingerprint("http://a/done"))])
    frontier.ack(frontier.lease("w", 1))
    df = DupeFilter(settings)
    try:
        assert df.request_seen(scrapy.Request("http://a/done"))  # done in the crawl
        assert not df.request_seen(scrapy.Request("http://a/1", meta={"v": 1}))
        assert not df.request_seen(scrapy.Request("http://a/1", meta={"v": 2}))  # new version
        assert df.request_seen(scrapy.Request("http://a/1", meta={"v": 2}))
        assert not df.request_seen(scrapy.Request("http://a/1"))  # no version
    finally:
        df.close("finished")
    frontier.purge()
    assert frontier.done.redis_keys() == []
    assert redis7_client.keys("rc:{df}:fps:*") == []
