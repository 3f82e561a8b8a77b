"""The envelope codec: round trips, compactness, Scrapy requests, and hostile input."""

from __future__ import annotations

import ast
import functools
import importlib
import json
import pkgutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import msgpack
import pytest
import scrapy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scrapy.http import FormRequest, JsonRequest

import redcrawl
from redcrawl import codec
from redcrawl.codec import Envelope, decode, encode, from_request, to_request
from redcrawl.errors import DecodeError, EncodeError

FP = bytes(range(20))


class MySpider(scrapy.Spider):
    name = "codec-spider"
    converter = dict  # a callable attribute that is not a method of the spider

    def parse(self, response: Any) -> None:  # pragma: no cover - never called
        pass

    def _parse(self, response: Any, **kwargs: Any) -> None:  # pragma: no cover - never called
        pass

    def parse_detail(self, response: Any) -> None:  # pragma: no cover - never called
        pass

    def on_error(self, failure: Any) -> None:  # pragma: no cover - never called
        pass


class CustomRequest(scrapy.Request):
    """A project's own Request subclass (not known to the codec)."""


def module_level_callback(response: Any) -> None:  # pragma: no cover - never called
    pass


@pytest.fixture
def spider() -> MySpider:
    return MySpider()


@pytest.fixture
def allowed(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """A private copy of the allowed request classes, restored after the test."""
    copy = set(codec._ALLOWED_CLASSES)
    monkeypatch.setattr(codec, "_ALLOWED_CLASSES", copy)
    return copy


def raw(env: Envelope) -> dict[str, Any]:
    return msgpack.unpackb(encode(env), raw=False)  # type: ignore[no-any-return]


def packed(d: Any) -> bytes:
    return msgpack.packb(d, use_bin_type=True)  # type: ignore[no-any-return]


# --- Envelope <-> bytes ----------------------------------------------------------------


FULL = Envelope(
    url="http://example.com/ü/path?q=1&r=2",
    method="POST",
    headers=[(b"X-Multi", [b"a", b"b", b"c"]), (b"Content-Type", [b"application/x-thing"])],
    body=b"\x00\xff\xfe\x00binary\x80\xc3(",  # NUL bytes and invalid UTF-8
    cookies={"sid": "abc", "n": "1"},
    meta={
        "depth": 2,
        "nested": {"l": [1, 2.5, None, True, b"\x00\xff", "s", {"deep": [[]]}]},
        "big": 2**64 - 1,
        "small": -(2**63),
        "download_timeout": 12.5,
    },
    callback="parse",
    errback="on_error",
    priority=-7,
    flags=["cached", "retry"],
    dont_filter=False,
    cb_kwargs={"page": 3, "tags": ["a", "b"]},
    encoding="latin-1",
    request_class="scrapy.http.request.form.FormRequest",
    extra={"dumps_kwargs": {"sort_keys": True}},
    fingerprint=FP,
)


def test_round_trip_every_field() -> None:
    data = encode(FULL)
    assert isinstance(data, bytes)
    back = decode(data)
    assert back == FULL
    assert back.body == b"\x00\xff\xfe\x00binary\x80\xc3("
    assert back.headers[0] == (b"X-Multi", [b"a", b"b", b"c"])
    assert back.meta["big"] == 2**64 - 1 and back.meta["small"] == -(2**63)
    assert back.fingerprint == FP


def test_round_trip_cookie_list_dont_filter_and_extremes() -> None:
    env = Envelope(
        url="https://example.org/",
        method="PUT",
        cookies=[{"name": "a", "value": "1", "domain": "example.org"}, {"name": "b", "value": "2"}],
        dont_filter=True,
        priority=1_000_000,
        body=bytes(range(256)),
    )
    back = decode(encode(env))
    assert back == env
    assert back.cookies == [
        {"name": "a", "value": "1", "domain": "example.org"},
        {"name": "b", "value": "2"},
    ]
    low = Envelope(url="http://x/", priority=-1_000_000)
    assert decode(encode(low)).priority == -1_000_000


def test_dont_filter_envelope_carries_no_fingerprint() -> None:
    env = Envelope(url="http://x/", dont_filter=True, fingerprint=FP)
    assert "f" not in raw(env)
    back = decode(encode(env))
    assert back.dont_filter is True and back.fingerprint is None


def test_defaults_are_left_out_of_the_bytes() -> None:
    url = "http://example.com/some/page?id=12345"
    assert set(raw(Envelope(url=url))) == {"v", "u"}
    with_fp = Envelope(url=url, fingerprint=FP)
    assert set(raw(with_fp)) == {"v", "u", "f"}
    assert len(encode(with_fp)) < len(url) + 40
    assert len(encode(Envelope(url=url))) < len(url) + 10
    # Explicit defaults are omitted too.
    explicit = Envelope(
        url=url,
        method="GET",
        encoding="utf-8",
        priority=0,
        dont_filter=False,
        body=b"",
        meta={},
        flags=[],
        cb_kwargs={},
        headers=[],
        extra={},
    )
    assert encode(explicit) == encode(Envelope(url=url))
    # And every non-default field does show up under its short key.
    assert set(raw(FULL)) == {
        "v",
        "u",
        "m",
        "h",
        "b",
        "c",
        "mt",
        "cb",
        "eb",
        "p",
        "fl",
        "k",
        "e",
        "cls",
        "x",
        "f",
    }
    assert raw(FULL)["v"] == codec.PLAIN_VERSION == 1  # plain data: readable by v1 workers


@pytest.mark.parametrize("priority", [1_000_001, -1_000_001, 10**12, 1.5, "3"])
def test_priority_out_of_range_or_not_int_is_encode_error(priority: Any) -> None:
    with pytest.raises(EncodeError, match="priority"):
        encode(Envelope(url="http://x/", priority=priority))


@pytest.mark.parametrize("url", ["", None, b"http://x/"])
def test_bad_url_is_encode_error(url: Any) -> None:
    with pytest.raises(EncodeError):
        encode(Envelope(url=url))


class Thing:
    pass


@pytest.mark.parametrize("bad", [Thing(), 1 + 2j, {Thing()}, (1, Thing())])
def test_unstorable_meta_value_names_its_path(bad: Any) -> None:
    env = Envelope(url="http://x/", meta={"ok": 1, "a": {"b": [0, bad]}})
    with pytest.raises(EncodeError) as info:
        encode(env)
    assert "meta['a']['b'][1]" in str(info.value)
    assert type(bad).__name__ in str(info.value)


def test_unstorable_cb_kwargs_cookies_and_extra_are_encode_errors() -> None:
    with pytest.raises(EncodeError, match=r"cb_kwargs\['x'\]"):
        encode(Envelope(url="http://x/", cb_kwargs={"x": Thing()}))
    with pytest.raises(EncodeError, match="cookies"):
        encode(Envelope(url="http://x/", cookies={"x": Thing()}))
    with pytest.raises(EncodeError):
        encode(Envelope(url="http://x/", extra={"x": Thing()}))


@pytest.mark.parametrize("big", [2**64, -(2**63) - 1, 10**30])
def test_int_over_64_bits_in_meta_is_encode_error(big: int) -> None:
    with pytest.raises(EncodeError, match="64 bits") as info:
        encode(Envelope(url="http://x/", meta={"n": [big]}))
    assert "meta['n'][0]" in str(info.value)


def test_non_string_meta_keys_round_trip_but_cb_kwargs_keys_must_be_strings() -> None:
    meta = {"a": {1: "x", b"k": 2, (1, "t"): 3, None: 4}}
    assert decode(encode(Envelope(url="http://x/", meta=meta))).meta == meta
    with pytest.raises(EncodeError, match="cb_kwargs keys"):
        encode(Envelope(url="http://x/", cb_kwargs={1: "x"}))  # type: ignore[dict-item]
    with pytest.raises(DecodeError, match="cb_kwargs"):
        decode(packed({"v": 1, "u": "http://x/", "k": {1: "x"}}))


def test_meta_nested_too_deep_is_encode_error() -> None:
    deep: Any = "leaf"
    for _ in range(1100):
        deep = [deep]
    with pytest.raises(EncodeError, match="nested"):
        encode(Envelope(url="http://x/", meta={"d": deep}))


def test_lone_surrogate_in_meta_is_encode_error() -> None:
    with pytest.raises(EncodeError):
        encode(Envelope(url="http://x/", meta={"name": "caf\udce9"}))


def test_unstorable_flag_is_encode_error() -> None:
    with pytest.raises(EncodeError):
        encode(Envelope(url="http://x/", flags=[Thing()]))  # type: ignore[list-item]


# --- decoding hostile bytes -------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",  # never-used msgpack byte
        b"\x81",  # truncated map
        b"garbage that is not msgpack \xff\xfe",
        b"\xff" * 64,
        packed({"v": 1, "u": "http://x/"}) + b"\x00",  # trailing data
        packed([1, "http://x/"]),
        packed("http://x/"),
        packed(None),
        packed({"v": 3, "u": "http://x/"}),
        packed({"v": 0, "u": "http://x/"}),
        packed({"v": "1", "u": "http://x/"}),
        packed({"u": "http://x/"}),
        packed({"v": 1}),
        packed({"v": 1, "u": ""}),
        packed({"v": 1, "u": 5}),
        packed({"v": 1, "u": b"http://x/"}),
        packed({1: 1}),  # integer map key
        b"\x82\xa1v\x01\xa1u\xa3\xff\xfe\xfd",  # URL str with invalid UTF-8
    ],
)
def test_decode_rejects_garbage(data: bytes) -> None:
    with pytest.raises(DecodeError):
        decode(data)


def test_future_version_message_says_what_to_do() -> None:
    with pytest.raises(DecodeError, match="version 3"):
        decode(packed({"v": 3, "u": "http://x/", "new": "field"}))


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("m", 5),
        ("h", "X-A: b"),
        ("h", [["X-A"]]),
        ("h", [5]),
        ("h", [[b"a", 5]]),
        ("h", [[b"a", ["v"]]]),
        ("h", [[-1, []]]),
        ("b", "text body"),
        ("mt", [1, 2]),
        ("cb", 1),
        ("eb", b"on_error"),
        ("p", "1"),
        ("p", 1.5),
        ("fl", {"a": 1}),
        ("df", 1),
        ("df", "yes"),
        ("k", [1]),
        ("e", 8),
        ("cls", ["scrapy.Request"]),
        ("x", "dumps"),
        ("f", "not-bytes"),
        ("m", None),
    ],
)
def test_decode_rejects_wrong_field_types(key: str, value: Any) -> None:
    with pytest.raises(DecodeError):
        decode(packed({"v": 1, "u": "http://x/", key: value}))


@pytest.mark.parametrize(
    "headers",
    [[[3, [b"v"]]], [[b"X-A", [4]]], [[2**63, []]]],
    ids=["int-name", "int-value", "huge-int-name"],
)
def test_decode_rejects_integer_headers(headers: Any) -> None:
    with pytest.raises(DecodeError):
        decode(packed({"v": 1, "u": "http://x/", "h": headers}))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_decode_random_bytes_only_ever_raises_decode_error(data: bytes) -> None:
    try:
        env = decode(data)
    except DecodeError:
        return
    assert isinstance(env, Envelope) and isinstance(env.url, str) and env.url


def _values() -> st.SearchStrategy[Any]:
    # Small ints only: huge integers in headers are the known bug tested above.
    leaves = (
        st.none()
        | st.booleans()
        | st.integers(-300, 300)
        | st.floats(allow_nan=False)
        | st.text(max_size=8)
        | st.binary(max_size=8)
    )
    return st.recursive(
        leaves,
        lambda kids: (
            st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=3), kids, max_size=3)
        ),
        max_leaves=8,
    )


# Every envelope field, and "zz", which no envelope has.
FIELDS = [
    "v",
    "u",
    "m",
    "h",
    "b",
    "c",
    "mt",
    "cb",
    "eb",
    "p",
    "fl",
    "df",
    "k",
    "e",
    "cls",
    "x",
    "f",
    "zz",
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(FIELDS), _values(), max_size=8), st.booleans())
def test_decode_random_maps_only_ever_raises_decode_error(d: dict[str, Any], valid: bool) -> None:
    if valid:  # mostly-valid envelopes reach the per-field checks
        d = {**d, "v": 1, "u": "http://x/"}
    try:
        env = decode(packed(d))
    except DecodeError:
        return
    assert isinstance(env, Envelope)


# --- Scrapy requests ---------------------------------------------------------------------


def through_redis(
    request: scrapy.Request, spider: scrapy.Spider | None, fingerprint: bytes | None = None
) -> scrapy.Request:
    env = from_request(request, spider, fingerprint=fingerprint)
    back = decode(encode(env))
    if env.dont_filter:  # dont_filter requests are stored without their fingerprint
        assert back.fingerprint is None
        env.fingerprint = None
    assert back == env
    return to_request(back, spider)


def test_scrapy_request_round_trip(spider: MySpider) -> None:
    req = scrapy.Request(
        "http://example.com/a?b=1",
        callback=spider.parse_detail,
        errback=spider.on_error,
        method="POST",
        headers={"X-A": ["1", "2"], "User-Agent": "ua"},
        body=b"\x00\xff\x00",
        cookies={"k": "v"},
        meta={"m": {"n": [1, 2]}, "b": b"\x01"},
        priority=5,
        dont_filter=True,
        flags=["f1"],
        cb_kwargs={"x": 1},
        encoding="latin-1",
    )
    env = from_request(req, spider, fingerprint=FP)
    assert env.callback == "parse_detail" and env.errback == "on_error"
    assert env.request_class is None and env.extra == {}
    out = through_redis(req, spider, FP)
    assert type(out) is scrapy.Request
    assert out.url == req.url and out.method == "POST"
    assert out.callback == spider.parse_detail and out.errback == spider.on_error
    assert out.headers.getlist("X-A") == [b"1", b"2"]
    assert out.headers.get("User-Agent") == b"ua"
    assert out.body == b"\x00\xff\x00"
    assert out.cookies == {"k": "v"}
    assert out.meta == {"m": {"n": [1, 2]}, "b": b"\x01"}
    assert (out.priority, out.dont_filter, out.flags, out.cb_kwargs, out.encoding) == (
        5,
        True,
        ["f1"],
        {"x": 1},
        "latin-1",
    )


def test_plain_get_request_round_trip(spider: MySpider) -> None:
    req = scrapy.Request("http://example.com/", callback=spider.parse)
    out = through_redis(req, spider, FP)
    assert (out.url, out.method, out.body, out.callback) == (
        "http://example.com/",
        "GET",
        b"",
        spider.parse,
    )
    assert out.meta == {} and out.cb_kwargs == {} and out.flags == []
    assert out.errback is None and out.priority == 0 and not out.dont_filter


def test_request_without_callback_round_trip(spider: MySpider) -> None:
    out = through_redis(
        scrapy.Request("http://example.com/x", cookies=[{"name": "a", "value": "1"}]), spider
    )
    assert out.callback is None and out.errback is None
    assert out.cookies == [{"name": "a", "value": "1"}]


def test_form_request_round_trip(spider: MySpider) -> None:
    req = FormRequest(
        "http://example.com/post", formdata={"a": "1", "b": ["2", "3 4"]}, callback=spider.parse
    )
    env = from_request(req, spider)
    assert env.request_class == "scrapy.http.request.form.FormRequest"
    out = through_redis(req, spider)
    assert type(out) is FormRequest
    assert out.method == "POST"
    assert out.body == req.body == b"a=1&b=2&b=3+4"
    assert out.headers.get("Content-Type") == b"application/x-www-form-urlencoded"
    assert out.callback == spider.parse


def test_json_request_round_trip_keeps_dumps_kwargs(spider: MySpider) -> None:
    req = JsonRequest(
        "http://example.com/api",
        data={"k": [1, 2], "z": None},
        dumps_kwargs={"indent": 2},
        callback=spider.parse,
    )
    env = from_request(req, spider)
    assert env.request_class == "scrapy.http.request.json_request.JsonRequest"
    assert env.extra == {"dumps_kwargs": {"indent": 2, "sort_keys": True}}
    out = through_redis(req, spider)
    assert type(out) is JsonRequest
    assert out.method == "POST"
    assert json.loads(out.body) == {"k": [1, 2], "z": None}
    assert out.body == req.body
    assert out.dumps_kwargs == {"indent": 2, "sort_keys": True}
    assert out.headers.get("Content-Type") == b"application/json"


def test_unknown_request_subclass_needs_allow_request_class(
    spider: MySpider, allowed: set[str]
) -> None:
    path = f"{__name__}.CustomRequest"
    req = CustomRequest("http://example.com/c", callback=spider.parse, meta={"a": 1})
    with pytest.raises(EncodeError, match="allow_request_class") as info:
        from_request(req, spider)
    assert path in str(info.value)
    # An envelope naming it is refused on the way back too.
    env = Envelope(url="http://example.com/c", request_class=path)
    with pytest.raises(DecodeError, match="allow_request_class"):
        to_request(decode(encode(env)), spider)

    codec.allow_request_class(path)
    out = through_redis(req, spider)
    assert type(out) is CustomRequest
    assert out.meta == {"a": 1} and out.callback == spider.parse


def test_lambda_and_foreign_callbacks_are_encode_errors(spider: MySpider) -> None:
    callbacks: tuple[Callable[..., Any], ...] = (lambda r: None, module_level_callback, Thing)
    for cb in callbacks:
        with pytest.raises(EncodeError, match="spider methods"):
            from_request(scrapy.Request("http://x/", callback=cb), spider)
    with pytest.raises(EncodeError):
        from_request(
            scrapy.Request("http://x/", callback=spider.parse, errback=lambda f: None), spider
        )
    # Without a spider there is nothing to name a callback by.
    with pytest.raises(EncodeError):
        from_request(scrapy.Request("http://x/", callback=spider.parse), None)


def test_a_partial_callback_is_refused_with_the_cb_kwargs_way_to_write_it(
    spider: MySpider,
) -> None:
    """``callback=partial(self.parse_item, page=2)``, the way to pass arguments before
    Scrapy's cb_kwargs: refused (a worker cannot look it up by name), and the message
    says how to write it."""
    callback = functools.partial(cast(Any, spider.parse), page=2)
    request = scrapy.Request("http://x/", callback=callback)
    with pytest.raises(EncodeError, match="partial") as info:
        from_request(request, spider)
    assert "cb_kwargs={" in str(info.value)


def test_request_with_unstorable_meta_fails_at_encode(spider: MySpider) -> None:
    req = scrapy.Request("http://x/", meta={"a": {"b": [1, Thing()]}})
    with pytest.raises(EncodeError, match=r"meta\['a'\]\['b'\]\[1\]"):
        encode(from_request(req, spider))
    with pytest.raises(EncodeError, match="priority"):
        encode(from_request(scrapy.Request("http://x/", priority=2_000_000), spider))


@pytest.mark.parametrize(
    "name", ["__init__", "__class__", "__reduce__", "name", "nope", "start_urls", "custom_settings"]
)
def test_callback_that_is_not_a_spider_method_is_decode_error(spider: MySpider, name: str) -> None:
    env = decode(encode(Envelope(url="http://x/", callback=name)))
    with pytest.raises(DecodeError, match=name):
        to_request(env, spider)
    env = decode(encode(Envelope(url="http://x/", callback="parse", errback=name)))
    with pytest.raises(DecodeError, match=name):
        to_request(env, spider)


@pytest.mark.parametrize("name", ["converter", "close"])
def test_callable_non_method_attribute_is_decode_error(spider: MySpider, name: str) -> None:
    with pytest.raises(DecodeError):
        to_request(Envelope(url="http://x/", callback=name), spider)


EVIL = "redcrawl_evil_module_xyz"


@pytest.mark.parametrize(
    "path", [f"{EVIL}.Cls", "os.system", "subprocess.Popen", "builtins.eval", "scrapy.Spider"]
)
def test_disallowed_request_class_is_never_imported(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spider: MySpider
) -> None:
    # A real, importable module whose import would leave a mark.
    marker = tmp_path / "imported"
    (tmp_path / f"{EVIL}.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nimport scrapy\nclass Cls(scrapy.Request):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    imports: list[str] = []
    real_import = importlib.import_module

    def recording_import(name: str, *a: Any) -> Any:
        imports.append(name)
        return real_import(name, *a)

    monkeypatch.setattr(importlib, "import_module", recording_import)

    env = decode(encode(Envelope(url="http://x/", request_class=path)))
    assert env.request_class == path
    with pytest.raises(DecodeError, match="not allowed"):
        to_request(env, spider)
    assert EVIL not in sys.modules
    assert not marker.exists()
    assert imports == []


def test_allowed_but_bogus_class_is_decode_error(allowed: set[str], spider: MySpider) -> None:
    codec.allow_request_class("os.getcwd")
    codec.allow_request_class("redcrawl_no_such_module_abc.Req")
    with pytest.raises(DecodeError, match=r"not a scrapy\.Request subclass"):
        to_request(Envelope(url="http://x/", request_class="os.getcwd"), spider)
    with pytest.raises(DecodeError, match="cannot be imported"):
        to_request(
            Envelope(url="http://x/", request_class="redcrawl_no_such_module_abc.Req"), spider
        )


def test_extra_attributes_unknown_to_the_class_are_ignored(spider: MySpider) -> None:
    out = to_request(Envelope(url="http://x/", extra={"dumps_kwargs": {"indent": 1}}), spider)
    assert type(out) is scrapy.Request


# --- no pickle, anywhere ------------------------------------------------------------------

UNSAFE = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve", "jsonpickle"}


def test_redcrawl_source_never_uses_pickle() -> None:
    """No module unpickles anything, except the one-time scrapy-redis migration
    (migrate.py), which may only subclass ``pickle.Unpickler`` (its ``find_class`` refuses
    every global) and name ``pickle.UnpicklingError``: never ``pickle.load(s)``."""
    package = Path(redcrawl.__file__).parent
    # Every submodule imports cleanly (so the files below are the code that runs).
    for mod in pkgutil.walk_packages([str(package)], "redcrawl."):
        if not mod.name.endswith(".__main__"):
            importlib.import_module(mod.name)
    files = sorted(package.rglob("*.py"))
    assert any(f.name == "codec.py" for f in files) and len(files) >= 8
    migration = package / "migrate.py"
    allowed_in_migration = {"Unpickler", "UnpicklingError"}
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if path == migration:
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "pickle"
                ):
                    assert node.attr in allowed_in_migration, (
                        f"{path}:{node.lineno} uses pickle.{node.attr}"
                    )
                if isinstance(node, ast.ImportFrom) and node.module == "pickle":
                    raise AssertionError(f"{path}:{node.lineno}: from pickle import ...")
                continue
            if isinstance(node, ast.Import):
                names = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                names = {(node.module or "").split(".")[0]}
            elif isinstance(node, ast.Name):
                names = {node.id}
            elif isinstance(node, ast.Attribute):
                names = {node.attr} & UNSAFE
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names = {node.value}  # e.g. importlib.import_module("pickle")
            else:
                continue
            assert not names & UNSAFE, f"{path}:{getattr(node, 'lineno', '?')} uses {names}"


# --- rebuilding without re-escaping the URL ----------------------------------------------

_URL_CHARS = "Aa0z9-._~:/?#[]@!$&'()*+,;=% \"<>\\^`{|}é\x7f\t"


@settings(max_examples=3000, deadline=None)
@given(
    st.sampled_from(
        [
            "http://",
            "https://",
            "HTTP://",
            "ftp://",
            "data:",
            "http://a.b",
            "https://x-1.com:8080/",
            "http://[::1]",
        ]
    ),
    st.text(alphabet=_URL_CHARS, max_size=30),
    st.sampled_from([scrapy.Request, FormRequest, JsonRequest]),
)
def test_rebuilt_url_is_what_scrapy_would_make_of_any_stored_url(
    prefix: str, rest: str, cls: type[scrapy.Request]
) -> None:
    """to_request skips Scrapy's URL escaping for URLs already in escaped form; for any
    string at all in an envelope, the request it builds has the URL Scrapy's own
    constructor gives (or both refuse it)."""
    url = prefix + rest
    env = Envelope(
        url=url, request_class=None if cls is scrapy.Request else f"{cls.__module__}.{cls.__name__}"
    )
    try:
        expected = cls(url).url
    except (TypeError, ValueError):
        with pytest.raises(DecodeError):
            to_request(env)
        return
    out = to_request(env)
    assert type(out) is cls
    assert out.url == expected


def test_rebuilt_request_is_a_plain_request_tracked_as_one(spider: MySpider) -> None:
    from scrapy.utils.trackref import live_refs

    before = len(live_refs.get(scrapy.Request, ()))
    out = to_request(Envelope(url="http://example.com/p?q=1", callback="parse", priority=3), spider)
    assert type(out) is scrapy.Request and out.__class__ is scrapy.Request
    assert len(live_refs[scrapy.Request]) == before + 1
    assert (out.url, out.priority, out.callback) == ("http://example.com/p?q=1", 3, spider.parse)
    assert out.replace(url="http://example.com/x y").url == "http://example.com/x%20y"
    assert codec._trusting_class(scrapy.Request) is not None  # the fast path is in use


def test_request_url_normalises_or_names_the_url() -> None:
    assert codec.request_url("http://Example.com/a b") == "http://example.com/a%20b"
    with pytest.raises(EncodeError, match="'nope'"):
        codec.request_url("nope")


def test_a_request_encoded_at_enqueue_is_not_encoded_again_for_its_record() -> None:
    """The Scrapy scheduler encodes a request to fail early (encode_for_store); the
    frontier's record reuses those bytes. A copy (dataclasses.replace) does not carry
    them: its fields may differ."""
    import dataclasses

    from redcrawl.envelope import encode_for_store
    from redcrawl.frontier.records import from_record, record

    env = codec.Envelope(url="http://a.test/x", meta={"depth": 2}, fingerprint=b"f" * 20)
    fresh = record(env)
    data = encode_for_store(env)
    assert data == codec.encode(env, fingerprint=False) and env.stored is data
    assert record(env) == fresh  # the same record, from the kept bytes
    env.stored = b"\x81\xa1v\x01"  # (the kept bytes are what the record holds)
    assert record(env).endswith(b"\x81\xa1v\x01")
    copy = dataclasses.replace(env, meta={"depth": 3})
    assert copy.stored is None and from_record(record(copy)).meta == {"depth": 3}
    assert dataclasses.replace(env) == env  # (not compared: the copy has none)
    assert "stored" not in repr(env)
