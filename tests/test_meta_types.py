"""Meta values that pickle but are not plain data, stored safely (issue 10 item 4), and
hostile envelopes written straight to Redis (issue 11 items 5 and 8).

Extension types round-trip with their types (tuples stay tuples); Items, dataclasses and
attrs instances travel by class path and are rebuilt without running project code; a
stored class path never imports anything; every failure of ``to_request`` on whatever
is in Redis is a DecodeError."""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import decimal
import enum
import subprocess
import sys
import uuid
import zoneinfo
from typing import Any

import attrs
import msgpack
import pytest
import redis
import scrapy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redcrawl import codec
from redcrawl.codec import Envelope, StoredItem, decode, encode, from_request, to_request
from redcrawl.errors import DecodeError, EncodeError

from .test_codec import FIELDS as ENVELOPE_FIELDS


class Product(scrapy.Item):
    name = scrapy.Field()
    price = scrapy.Field()
    tags = scrapy.Field()


@dataclasses.dataclass(frozen=True, slots=True)
class Offer:
    sku: str
    price: decimal.Decimal
    seen: dt.datetime
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


POST_INIT_CALLS: list[Any] = []


@dataclasses.dataclass
class Audited:
    value: int
    derived: int = dataclasses.field(init=False, default=0)

    def __post_init__(self) -> None:
        POST_INIT_CALLS.append(self.value)
        self.derived = self.value * 2


@attrs.define
class Review:
    stars: int
    text: str
    product: Product | None = None


@attrs.frozen
class Pair:
    left: Any
    right: Any


class Color(enum.IntEnum):
    RED = 1


Point = collections.namedtuple("Point", "x y")


class Spider(scrapy.Spider):
    name = "meta-types"

    def parse_item(self, response: Any) -> None:  # pragma: no cover - never called
        pass


@pytest.fixture
def spider() -> Spider:
    return Spider()


def through(client: redis.Redis, value: Any, spider: Spider) -> Any:
    """``value`` as meta of a request stored in Redis and rebuilt from it."""
    req = scrapy.Request("http://example.com/", callback=spider.parse_item, meta={"v": value})
    client.set("env", encode(from_request(req, spider)))
    data = client.get("env")
    assert isinstance(data, bytes)
    return to_request(decode(data), spider).meta["v"]


PARIS = zoneinfo.ZoneInfo("Europe/Paris")
VALUES: list[Any] = [
    dt.datetime(2024, 5, 6, 7, 8, 9, 123456),
    dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.UTC),
    dt.datetime(2024, 5, 6, 7, 8, tzinfo=dt.timezone(dt.timedelta(hours=-3, minutes=-30), "NST")),
    dt.datetime(2024, 10, 27, 2, 30, tzinfo=PARIS, fold=1),  # the second 02:30 that day
    dt.date(1999, 12, 31),
    dt.time(23, 59, 59, 999999),
    dt.time(1, 2, tzinfo=dt.timezone(dt.timedelta(hours=5))),
    dt.timedelta(days=-3, seconds=5, microseconds=7),
    decimal.Decimal("1.10"),
    decimal.Decimal("-0"),
    decimal.Decimal("NaN"),
    decimal.Decimal("1E+999999"),
    {1, 2, "a"},
    frozenset({b"x", (1, 2)}),
    set(),
    (1, (2, (3, [4, (5,)])), {"k": ()}),
    (),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    {1: "int key", b"b": "bytes key", (1, "t"): "tuple key", None: 0, 2.5: "float key"},
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_fixed_types_round_trip_with_their_types(
    redis7_client: redis.Redis, spider: Spider, value: Any
) -> None:
    out = through(redis7_client, value, spider)
    if isinstance(value, decimal.Decimal) and value.is_nan():
        assert out.is_nan() and type(out) is decimal.Decimal
        return
    assert out == value and type(out) is type(value)
    if isinstance(value, decimal.Decimal):
        assert repr(out) == repr(value)  # Decimal("1.10") keeps its exponent, -0 its sign
    if isinstance(value, dt.datetime | dt.time):
        assert out.tzinfo == value.tzinfo and out.fold == value.fold
        assert out.utcoffset() == value.utcoffset()


def test_items_dataclasses_and_attrs_round_trip(redis7_client: redis.Redis, spider: Spider) -> None:
    when = dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    product = Product(name="Lamp", price=decimal.Decimal("9.90"), tags=("a", "b"))
    meta = {
        "item": product,
        "offer": Offer("SKU-1", decimal.Decimal("9.90"), when, {"k": {1, 2}}),
        "review": Review(5, "good", product),
        "pair": Pair(Offer("x", decimal.Decimal(1), when), (1, 2)),
    }
    out = through(redis7_client, meta, spider)
    assert out == meta
    assert type(out["item"]) is Product and out["item"]["tags"] == ("a", "b")
    assert type(out["offer"]) is Offer and out["offer"].extra == {"k": {1, 2}}
    assert type(out["review"].product) is Product
    with pytest.raises(dataclasses.FrozenInstanceError):
        out["offer"].sku = "changed"  # type: ignore[misc]  # still the frozen class


def test_rebuilding_runs_no_project_code(redis7_client: redis.Redis, spider: Spider) -> None:
    original = Audited(21)
    POST_INIT_CALLS.clear()
    out = through(redis7_client, original, spider)
    assert POST_INIT_CALLS == []  # rebuilt as pickle does: no __init__, no __post_init__
    assert (type(out), out.value, out.derived) == (Audited, 21, 42)


def test_subclasses_of_plain_types_are_stored_as_the_plain_type(
    redis7_client: redis.Redis, spider: Spider
) -> None:
    meta = {
        "od": collections.OrderedDict(a=1),
        "dd": collections.defaultdict(int, b=2),
        "enum": Color.RED,
        "point": Point(1, 2),
        "ba": bytearray(b"xy"),
    }
    out = through(redis7_client, meta, spider)
    assert out == {"od": {"a": 1}, "dd": {"b": 2}, "enum": 1, "point": (1, 2), "ba": b"xy"}
    assert [type(out[k]) for k in ("od", "dd", "enum", "point", "ba")] == [
        dict,
        dict,
        int,
        tuple,
        bytes,
    ]


def test_version_1_for_plain_data_version_2_only_with_extensions() -> None:
    plain = msgpack.unpackb(encode(Envelope(url="http://x/", meta={"a": [1]})))
    assert plain["v"] == codec.PLAIN_VERSION == 1
    tagged = msgpack.unpackb(
        encode(Envelope(url="http://x/", meta={"a": (1,)})), ext_hook=lambda code, data: code
    )
    assert tagged["v"] == codec.FORMAT_VERSION == 2 and tagged["mt"] == {"a": 1}


def test_old_version_1_envelopes_still_decode(spider: Spider) -> None:
    """Bytes as the version-1 codec wrote them (meta of plain data, a list for a tuple)."""
    old = msgpack.packb(
        {
            "v": 1,
            "u": "http://x/",
            "mt": {"t": [1, 2], "n": {"a": None}},
            "cb": "parse_item",
            "p": 3,
            "f": bytes(20),
        },
        use_bin_type=True,
    )
    req = to_request(decode(old), spider)
    assert req.meta == {"t": [1, 2], "n": {"a": None}} and req.priority == 3
    assert req.callback == spider.parse_item


class Thing:
    pass


def test_what_still_cannot_be_stored_is_an_encode_error_naming_the_key() -> None:
    cases: list[tuple[Any, str]] = [
        ({"a": [Thing()]}, "meta['a'][0] holds a value of type Thing"),
        ({"a": Offer("x", decimal.Decimal(1), dt.datetime(2024, 1, 1), {"o": Thing()})}, "Thing"),
        ({"a": (1, {Thing()})}, "Thing"),
        ({"f": lambda: 1}, "meta['f'] holds a value of type function"),
        ({"t": dt.datetime(2024, 1, 1, tzinfo=FixedTz())}, "time zone"),
        ({"c": 1 + 2j}, "complex"),
    ]
    for meta, words in cases:
        with pytest.raises(EncodeError) as info:
            encode(Envelope(url="http://x/", meta=meta))
        assert words in str(info.value), (meta, str(info.value))


class FixedTz(dt.tzinfo):
    def utcoffset(self, d: Any) -> dt.timedelta:
        return dt.timedelta(hours=1)

    def tzname(self, d: Any) -> str:
        return "+01:00"

    def dst(self, d: Any) -> dt.timedelta:
        return dt.timedelta(0)


def test_classes_a_worker_cannot_find_are_refused_at_encode() -> None:
    @dataclasses.dataclass
    class Local:
        x: int

    with pytest.raises(EncodeError, match="defined in a function"):
        encode(Envelope(url="http://x/", meta={"l": Local(1)}))


def item_env(path: str, kind: str, fields: dict[str, Any]) -> bytes:
    payload = msgpack.packb([path, kind, fields], use_bin_type=True)
    out: bytes = msgpack.packb(
        {"v": 2, "u": "http://x/", "mt": {"i": msgpack.ExtType(10, payload)}}, use_bin_type=True
    )
    return out


@pytest.mark.parametrize(
    ("path", "kind", "words"),
    [
        ("os:system", "dataclass", "not a class"),
        ("subprocess:Popen", "item", "not a item"),
        ("builtins:eval", "attrs", "not a class"),
        ("tests.test_meta_types:Thing", "dataclass", "not a dataclass"),
        ("tests.test_meta_types:Offer", "attrs", "not a attrs"),
        ("tests.test_meta_types:Nope", "item", "does not exist"),
        ("tests.test_meta_types:Offer.__init__", "dataclass", "not a class"),
        ("tests.test_meta_types:Offer.nope", "dataclass", "does not exist"),
    ],
)
def test_stored_class_paths_pick_only_item_classes(path: str, kind: str, words: str) -> None:
    with pytest.raises(DecodeError, match=words):
        decode(item_env(path, kind, {}))


def test_unknown_fields_are_a_decode_error(spider: Spider) -> None:
    with pytest.raises(DecodeError, match="does not declare"):
        decode(item_env("tests.test_meta_types:Product", "item", {"name": 1, "evil": 2}))
    with pytest.raises(DecodeError, match="lacks fields"):
        decode(item_env("tests.test_meta_types:Offer", "dataclass", {"sku": "x"}))


def test_a_stored_class_path_never_imports_a_module(spider: Spider) -> None:
    """Decoding in a process that has not imported the module: a StoredItem placeholder
    (inspection shows it, encodes it back unchanged), the module still not imported, and
    to_request a DecodeError saying what to do."""
    code = """
import sys
from redcrawl.codec import decode, encode, to_request, StoredItem
from redcrawl.errors import DecodeError
data = bytes.fromhex(sys.argv[1])
env = decode(data)
item = env.meta["i"]
assert isinstance(item, StoredItem) and item.fields == {"x": 1}, item
assert "json.tool" not in sys.modules and "email.mime.text" not in sys.modules
assert decode(encode(env)).meta["i"].path == item.path
try:
    to_request(env)
except DecodeError as exc:
    assert "has not imported module 'email.mime.text'" in str(exc), exc
else:
    raise AssertionError("to_request rebuilt an item of a module never imported")
assert "email.mime.text" not in sys.modules
print("ok")
"""
    data = item_env("email.mime.text:MIMEText", "dataclass", {"x": 1})
    out = subprocess.run(
        [sys.executable, "-c", code, data.hex()],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": codec.__file__.rsplit("/redcrawl/", 1)[0]},
    )
    assert out.stdout.strip() == "ok", out.stderr


def test_stored_item_resolves_once_the_module_is_imported(spider: Spider) -> None:
    env = decode(item_env("tests.test_meta_types:Product", "item", {"name": "n"}))
    assert not env.unresolved and type(env.meta["i"]) is Product
    placeholder = Envelope(
        url="http://x/",
        meta={"i": StoredItem("tests.test_meta_types:Product", "item", {"name": "n"})},
        unresolved=True,
    )
    assert to_request(placeholder, spider).meta["i"] == Product(name="n")


# --- any values -------------------------------------------------------------------------


def storable() -> st.SearchStrategy[Any]:
    keys = st.text(max_size=3) | st.integers(-5, 5) | st.binary(max_size=3)
    leaves = (
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**64 - 1)
        | st.floats(allow_nan=False)
        | st.text(max_size=6)
        | st.binary(max_size=6)
        | st.datetimes(timezones=st.none() | st.just(dt.UTC))
        | st.dates()
        | st.times()
        | st.timedeltas()
        | st.decimals(allow_nan=False)
        | st.uuids()
    )
    return st.recursive(
        leaves,
        lambda kids: (
            st.lists(kids, max_size=3)
            | st.tuples(kids, kids)
            | st.dictionaries(keys, kids, max_size=3)
            | st.frozensets(st.integers(-9, 9) | st.text(max_size=3), max_size=3)
            | st.sets(st.integers(-(2**63), 2**63), max_size=3)
            | st.builds(Product, name=kids, price=kids)
        ),
        max_leaves=10,
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(storable())
def test_any_storable_meta_round_trips_with_its_types(value: Any) -> None:
    out = decode(encode(Envelope(url="http://x/", meta={"v": value}))).meta["v"]
    assert _typed(out) == _typed(value)


def _typed(value: Any) -> Any:
    """``value`` with the type of every part spelled out (1 == 1.0 == True in Python)."""
    if isinstance(value, dict):
        return ("dict", sorted((repr(_typed(k)), repr(_typed(v))) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return (type(value).__name__, [_typed(v) for v in value])
    if isinstance(value, set | frozenset):
        return (type(value).__name__, sorted(repr(_typed(v)) for v in value))
    if isinstance(value, Product):
        return ("Product", _typed(dict(value)))
    if isinstance(value, float) and value != value:
        return ("float", "nan")
    return (type(value).__name__, repr(value))


def _garbage() -> st.SearchStrategy[Any]:
    leaves = (
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**64 - 1)
        | st.floats()
        | st.text(max_size=12)
        | st.binary(max_size=12)
        | st.sampled_from(
            [
                "nope",
                "utf-16",
                "idna",
                "rot13",
                "latin-1",
                "base64",
                "http://exa mple.com/é ü",
                "parse_item",
                "_set_crawler",
                "scrapy.http.FormRequest",
                "GET",
                "POST\r\n",
            ]
        )
        | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=12))
    )
    return st.recursive(
        leaves,
        lambda kids: (
            st.lists(kids, max_size=3)
            | st.dictionaries(st.text(max_size=3) | st.integers(-3, 3), kids, max_size=3)
        ),
        max_leaves=8,
    )


FIELDS = ENVELOPE_FIELDS[:-1]  # every envelope field ("zz" left out)


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    st.dictionaries(st.sampled_from(FIELDS), _garbage(), max_size=9),
    st.sampled_from([None, 1, 2]),
    st.sampled_from(["http://x/", "http://exa mple.com/ü ?q=é", "https://a.example/%zz#!x"]),
)
def test_to_request_of_anything_in_redis_is_a_request_or_a_decode_error(
    redis7_client: redis.Redis, spider: Spider, d: dict[str, Any], version: int | None, url: str
) -> None:
    if version is not None:
        d = {**d, "v": version, "u": d.get("u", url)}
    redis7_client.set("garbage", msgpack.packb(d, use_bin_type=True))
    data = redis7_client.get("garbage")
    assert isinstance(data, bytes)
    try:
        request = to_request(decode(data), spider)
    except DecodeError:
        return
    assert isinstance(request, scrapy.Request)


def test_unknown_encoding_with_a_url_to_escape_is_a_decode_error(spider: Spider) -> None:
    data = msgpack.packb({"v": 1, "u": "http://exa mple.com/ü ?q=é", "e": "nope"})
    with pytest.raises(DecodeError, match="nope"):
        to_request(decode(data), spider)


# --- a real crawl -------------------------------------------------------------------------


def test_meta_with_items_and_dates_survives_a_real_crawl(
    tmp_path: Any, redis7: Any, redis7_client: redis.Redis
) -> None:
    from redcrawl.demo import ShopSite, SiteConfig
    from tests.scrapy_projects.harness import frontier, run_spider

    redis7_client.flushall()
    with ShopSite(SiteConfig(products=4, tracking_params=False)) as site:
        run = run_spider(
            "meta_types_spider.py",
            tmp_path,
            redis_url=redis7.url,
            crawl="meta-types",
            args={"url": site.url},
        ).ok()
    got = run.report["spider"]["got"]
    assert len(got) == 2 and run.report["spider"]["equal"], got
    types = {k: t for k, (t, _) in got[0].items()}
    assert types == {
        "item": "Product",
        "offer": "Offer",
        "when": "datetime",
        "seen": "set",
        "pair": "tuple",
        "price": "Decimal",
        "cb_pair": "tuple",
    }
    assert got[0]["price"][1] == "Decimal('1.10')"
    assert run.stats.get("redcrawl/unstorable") is None
    c = frontier(redis7_client, "meta-types").counts()
    assert c.finished and c.conserved and c.done == 3 and c.dead == 0
