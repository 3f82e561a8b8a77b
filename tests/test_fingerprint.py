"""Tests for redcrawl.fingerprint: Scrapy compatibility, canonicalisation, versions."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import string
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
import scrapy
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from scrapy import Request
from scrapy.utils.request import fingerprint as scrapy_fingerprint
from w3lib.url import canonicalize_url, safe_url_string

from redcrawl.errors import ConfigError
from redcrawl.fingerprint import (
    DEFAULT_TRACKING_PARAMS,
    FINGERPRINT_SIZE,
    Canonicalizer,
    _canonical_url,
    _split_simple,
    fingerprint,
    request_fingerprint,
)

SETTING = "REDCRAWL_CANONICAL_DROP_PARAMS"

HYPOTHESIS = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def scrapy_fp(
    url: str,
    method: str = "GET",
    body: bytes = b"",
    headers: Mapping[Any, Any] | None = None,
    *,
    include_headers: Iterable[bytes | str] | None = None,
    keep_fragments: bool = False,
) -> bytes:
    request = Request(url, method=method, body=body, headers=headers)
    return scrapy_fingerprint(
        request, include_headers=include_headers, keep_fragments=keep_fragments
    )


def assert_matches_scrapy(
    url: str,
    method: str = "GET",
    body: bytes = b"",
    headers: Mapping[Any, Any] | None = None,
    *,
    include_headers: Iterable[bytes | str] = (),
    keep_fragments: bool = False,
) -> None:
    include = list(include_headers)
    try:
        expected = scrapy_fp(
            url,
            method,
            body,
            headers,
            include_headers=include,
            keep_fragments=keep_fragments,
        )
    except ValueError:
        # Scrapy cannot even build the request (e.g. a port out of range): neither can we.
        with pytest.raises(ValueError):
            fingerprint(
                url,
                method,
                body,
                headers,
                include_headers=include,
                keep_fragments=keep_fragments,
            )
        return
    got = fingerprint(
        url, method, body, headers, include_headers=include, keep_fragments=keep_fragments
    )
    assert got == expected, url


# ------------------------------------------------------------------ Scrapy compatibility

URLS = [
    "https://www.example.com/products/item?id=12345&color=blue&sz=m",
    "http://www.example.com/do?c=3&b=5&b=2&a=50",
    "http://www.example.com/do?a=50&b=2&b=5&c=3",
    "http://example.com",
    "http://example.com?a",
    "http://example.com/?a=&b&=c&&",
    "http://example.com/?&&",
    "http://example.com/?",
    "http://example.com/?q=a=b",
    "http://example.com/page#section",
    "http://example.com/page#",
    "http://example.com/#frag?with=query",
    "http://example.com/?q=1#fr%61g ment",
    "http://example.com/a%2fb%7Ec%20d",
    "http://example.com/a/./b/../../c",
    "http://example.com/a/b/..",
    "http://example.com/p;params?x=1",
    "http://example.com/a;b/c;d",
    "http://example.com/a+b?q=a+b&r=a%20b&s=a b",
    "http://example.com/a b?c d=e f",
    "http://example.com/foo'bar?x='y'",
    "http://example.com/%zz?%zz=1&q=%",
    "http://example.com/?q=b%a3",
    "http://example.com/r\u00e9sum\u00e9?q=caf\u00e9",
    "https://example.com/search?q=%E2%82%AC&x=%e2%82%ac",
    "http://b\u00fccher.de/stra\u00dfe",
    "http://\u4f8b\u3048.\u30c6\u30b9\u30c8/\u30d1\u30b9?\u30ad\u30fc=\u5024",
    "HTTP://EXAMPLE.COM:80/Path/../Other/./x?Q=1",
    "https://Example.com:443/",
    "http://example.com:8080",
    "http://example.com:080/",
    "http://user:pa%73s@Example.com/",
    "http://[::0:1]:8000/a/../b",
    "https://example.com\\path\\x",
    "  http://example.com/\n",
    "http://exa\tmple.com/a\nb",
    "http://example.com/[brackets]|pipe^caret`{}",
    "data:text/plain,hello",
    "about:blank",
    "ftp://ftp.example.com/pub/file.txt",
]


@pytest.mark.parametrize("keep_fragments", [False, True])
@pytest.mark.parametrize("url", URLS)
def test_get_matches_scrapy(url: str, keep_fragments: bool) -> None:
    assert_matches_scrapy(url, keep_fragments=keep_fragments)


@pytest.mark.parametrize(
    ("method", "body"),
    [
        ("POST", b"a=1&b=2"),
        ("post", b"a=1&b=2"),
        ("PUT", bytes(range(256))),
        ("DELETE", b""),
        ("GET", b"\x00"),
    ],
)
@pytest.mark.parametrize("url", URLS[:4] + URLS[20:24])
def test_methods_and_bodies_match_scrapy(url: str, method: str, body: bytes) -> None:
    assert_matches_scrapy(url, method, body)


def test_method_case_and_body_change_fingerprint_like_scrapy() -> None:
    url = "http://example.com/form"
    assert fingerprint(url, "post") == fingerprint(url, "POST")
    assert fingerprint(url, "POST", b"a=1") != fingerprint(url, "POST", b"a=2")
    assert fingerprint(url, "POST") != fingerprint(url, "GET")


HEADERS: dict[Any, Any] = {
    "Accept": "text/html",
    "X-Token": ["a", "b"],
    b"cookie": b"k=v",
    "X-Unicode": "caf\u00e9",
    "X-Empty": [],
    "X-None": None,
}


@pytest.mark.parametrize(
    "include_headers",
    [
        [],
        ["accept"],
        ["Accept", "X-TOKEN"],
        ["cookie", "missing-header"],
        [b"Accept", b"x-token"],
        ["x-unicode", "x-empty", "x-none"],
        ["missing-header"],
        ["accept", "ACCEPT"],
    ],
)
def test_headers_match_scrapy(include_headers: list[Any]) -> None:
    url = "http://example.com/a?b=1"
    assert_matches_scrapy(url, headers=HEADERS, include_headers=include_headers)


def test_headers_with_keys_differing_in_case_are_merged_like_scrapy() -> None:
    headers = {"accept": "a", "ACCEPT": ["b", "c"]}
    assert_matches_scrapy("http://example.com/", headers=headers, include_headers=["Accept"])
    merged = fingerprint("http://example.com/", headers=headers, include_headers=["Accept"])
    single = fingerprint("http://example.com/", headers={"accept": "a"}, include_headers=["Accept"])
    assert merged != single


def test_headers_only_count_when_included() -> None:
    url = "http://example.com/"
    plain = fingerprint(url)
    assert fingerprint(url, headers={"Accept": "x"}) == plain
    assert fingerprint(url, headers={"Accept": "x"}, include_headers=["missing"]) == plain
    assert fingerprint(url, include_headers=["accept"]) == plain
    with_header = fingerprint(url, headers={"Accept": "x"}, include_headers=["accept"])
    assert with_header != plain
    assert with_header != fingerprint(url, headers={"Accept": "y"}, include_headers=["accept"])


def test_fragments_matter_only_with_keep_fragments() -> None:
    a, b = "http://example.com/p#one", "http://example.com/p#two"
    assert fingerprint(a) == fingerprint(b)
    assert fingerprint(a, keep_fragments=True) != fingerprint(b, keep_fragments=True)


def test_invalid_url_raises_like_scrapy() -> None:
    with pytest.raises(ValueError):
        Request("http://example.com:99999/")
    with pytest.raises(ValueError):
        fingerprint("http://example.com:99999/")


# Hypothesis strategies ------------------------------------------------------------------

_PATH_CHARS = string.ascii_letters + string.digits + "-._~!$&'()*+,=:@%;/ \"<>^`{}|\u00e9\u20ac"
_QUERY_CHARS = string.ascii_letters + string.digits + "-._~+%/?:@!$'()*,; \u00e9\u20ac"
_FRAGMENT_CHARS = string.ascii_letters + string.digits + "-._~!$&'()*+,;=:@/?% #\u00e9"

hosts = st.one_of(
    st.from_regex(r"[a-zA-Z0-9][a-zA-Z0-9\-]{0,8}(\.[a-zA-Z0-9\-]{1,8}){0,3}", fullmatch=True),
    st.sampled_from(
        [
            "www.Example.COM",
            "b\u00fccher.de",
            "\u4f8b\u3048.jp",
            "127.0.0.1",
            "[::1]",
            "[2001:db8::0:1]",
            "user:pw@example.com",
            "xn--bcher-kva.de",
        ]
    ),
)
ports = st.one_of(
    st.just(""),
    st.sampled_from([":80", ":443", ":8080", ":080", ":0", ":65535", ":"]),
    st.integers(1, 70000).map(lambda port: f":{port}"),
)
segments = st.one_of(
    st.text(_PATH_CHARS, max_size=8),
    st.sampled_from([".", "..", "%2e", "%2F", "%41", "%7e", "%e2%82%ac", "a;b", "%zz"]),
)
paths = st.lists(segments, max_size=5).map(lambda parts: "".join("/" + p for p in parts))
names = st.one_of(
    st.sampled_from(
        ["utm_source", "UTM_Medium", "utm%5Fcampaign", "spm", "gclid", "id", "q", "a", "b", "A"]
    ),
    st.text(_QUERY_CHARS, max_size=6),
)
values = st.one_of(st.none(), st.text(_QUERY_CHARS + "=", max_size=6))
queries = st.one_of(
    st.just(""),
    st.lists(st.tuples(names, values), max_size=6).map(
        lambda pairs: "?" + "&".join(n if v is None else f"{n}={v}" for n, v in pairs)
    ),
)
fragments = st.one_of(st.just(""), st.text(_FRAGMENT_CHARS, max_size=8).map(lambda f: "#" + f))
urls = st.builds(
    lambda scheme, host, port, path, query, fragment: (
        f"{scheme}://{host}{port}{path}{query}{fragment}"
    ),
    st.sampled_from(["http", "https", "HTTP", "Https", "ftp"]),
    hosts,
    ports,
    paths,
    queries,
    fragments,
)

# URLs in the shape the fast path handles (most of them should take it).
_SIMPLE_PCHARS = string.ascii_letters + string.digits + "-._~!$&'()*+,=:@"
_SIMPLE_QCHARS = string.ascii_letters + string.digits + "-._~+"
_SIMPLE_NAMES = ["utm_source", "UTM_Medium", "spm", "gclid", "a", "b"]
simple_urls = st.builds(
    lambda scheme, host, port, path, query, fragment: (
        f"{scheme}://{host}{port}{path}{query}{fragment}"
    ),
    st.sampled_from(["http", "https"]),
    st.from_regex(r"[a-zA-Z0-9._\-]{1,20}", fullmatch=True),
    st.one_of(st.just(""), st.integers(1, 9999).map(lambda port: f":{port}")),
    st.one_of(
        st.just(""),
        st.lists(st.text(_SIMPLE_PCHARS, max_size=6), max_size=4).map(
            lambda parts: "".join("/" + p for p in parts)
        ),
    ),
    st.one_of(
        st.just(""),
        st.lists(
            st.tuples(
                st.one_of(st.text(_SIMPLE_QCHARS, max_size=5), st.sampled_from(_SIMPLE_NAMES)),
                st.one_of(st.none(), st.text(_SIMPLE_QCHARS, max_size=5)),
            ),
            max_size=6,
        ).map(lambda pairs: "?" + "&".join(n if v is None else f"{n}={v}" for n, v in pairs)),
    ),
    st.one_of(
        st.just(""),
        st.text(string.ascii_letters + "-._~!$&'()*+,;=:@/?%", max_size=6).map(lambda f: "#" + f),
    ),
)


@HYPOTHESIS
@given(url=urls, keep_fragments=st.booleans())
def test_generated_urls_match_scrapy(url: str, keep_fragments: bool) -> None:
    assert_matches_scrapy(url, keep_fragments=keep_fragments)


@HYPOTHESIS
@given(url=simple_urls, keep_fragments=st.booleans())
@example(url="http://a.b/?a+=1&a=1&a-=1&a =2", keep_fragments=False)
def test_fast_path_equals_w3lib(url: str, keep_fragments: bool) -> None:
    expected = canonicalize_url(safe_url_string(url), keep_fragments=keep_fragments)
    assert _canonical_url(url, keep_fragments) == expected
    assert_matches_scrapy(url, keep_fragments=keep_fragments)


@HYPOTHESIS
@given(tail=st.text(max_size=30))
def test_arbitrary_text_after_host_matches_scrapy(tail: str) -> None:
    assert_matches_scrapy("http://example.com/" + tail)


@HYPOTHESIS
@given(
    url=st.one_of(urls, simple_urls),
    method=st.sampled_from(["GET", "POST", "put", "Delete"]),
    body=st.binary(max_size=64),
    headers=st.dictionaries(
        st.sampled_from(["Accept", "accept", "X-Token", "Cookie", "x-TOKEN", "Content-Type"]),
        st.one_of(
            st.text(max_size=8),
            st.binary(max_size=8),
            st.lists(st.one_of(st.text(max_size=5), st.binary(max_size=5)), max_size=3),
        ),
        max_size=4,
    ),
    include_headers=st.lists(
        st.sampled_from(["accept", "X-TOKEN", "cookie", "missing", "content-type"]), max_size=3
    ),
    keep_fragments=st.booleans(),
)
def test_generated_requests_match_scrapy(
    url: str,
    method: str,
    body: bytes,
    headers: dict[str, Any],
    include_headers: list[str],
    keep_fragments: bool,
) -> None:
    assert_matches_scrapy(
        url,
        method,
        body,
        headers,
        include_headers=include_headers,
        keep_fragments=keep_fragments,
    )


@pytest.mark.parametrize(
    "url",
    [
        "https://www.example.com/products/item?id=12345&color=blue&sz=m",
        "http://example.com/",
        "http://example.com/a/b-c_d.html?page=2&sort=desc#reviews",
        "https://shop.example.co.uk:8443/cat/item-1?ref=home&q=red+shoes",
    ],
)
def test_typical_urls_take_the_fast_path(url: str) -> None:
    assert _split_simple(url) is not None


@pytest.mark.parametrize(
    "url",
    [
        "HTTP://example.com/",
        "http://example.com/a%20b",
        "http://example.com/a/../b",
        "http://example.com/a;b",
        "http://example.com/?a=b=c",
        "http://b\u00fccher.de/",
        "http://example.com:080/",
        "http://example.com:99999/",
        " http://example.com/",
        "http://user@example.com/",
    ],
)
def test_unusual_urls_fall_back_to_w3lib(url: str) -> None:
    assert _split_simple(url) is None


# ------------------------------------------------------------------- fingerprint basics


def test_size_is_20_bytes() -> None:
    assert FINGERPRINT_SIZE == 20
    for url in URLS[:5]:
        assert len(fingerprint(url)) == FINGERPRINT_SIZE
        assert len(fingerprint(url, version="7", canonicalizer=Canonicalizer())) == 20
    assert len(request_fingerprint(Request("http://example.com/"))) == FINGERPRINT_SIZE


def test_version_joins_the_hashed_data() -> None:
    url = "http://example.com/p?b=2&a=1"
    plain = fingerprint(url)
    v1 = fingerprint(url, version="1")
    v2 = fingerprint(url, version="2")
    assert len({plain, v1, v2, fingerprint(url, version="")}) == 4
    assert fingerprint(url, version="1") == v1
    assert plain == scrapy_fp(url)
    # The documented format: Scrapy's JSON with an extra "version" key.
    data = {
        "method": "GET",
        "url": "http://example.com/p?a=1&b=2",
        "body": "",
        "headers": {},
        "version": "1",
    }
    assert v1 == hashlib.sha1(json.dumps(data, sort_keys=True).encode()).digest()
    unicode_version = fingerprint(url, version="caf\u00e9\U0001f600")
    data["version"] = "caf\u00e9\U0001f600"
    assert unicode_version == hashlib.sha1(json.dumps(data, sort_keys=True).encode()).digest()


# ------------------------------------------------------------------ request_fingerprint


@pytest.mark.parametrize(
    "request_",
    [
        Request("http://example.com/a?b=2&a=1"),
        Request("https://example.com/form", method="POST", body=b"x=1"),
        Request("http://example.com/r\u00e9sum\u00e9#frag"),
        Request("http://example.com/p?q=1", headers={"Accept": "text/html"}),
        Request("http://Example.com/A/../b?Z=1", meta={"verbatim_url": True}),
        Request("http://example.com/x y", meta={"verbatim_url": True}),
    ],
)
def test_request_fingerprint_matches_scrapy(request_: Request) -> None:
    assert request_fingerprint(request_) == scrapy_fingerprint(request_)
    assert request_fingerprint(request_, version_meta_key="version") == scrapy_fingerprint(request_)


def test_request_fingerprint_version_meta_key() -> None:
    url = "http://example.com/item?id=1"
    versioned = Request(url, meta={"content_version": 3})
    assert request_fingerprint(versioned, version_meta_key="content_version") == fingerprint(
        url, version="3"
    )
    assert request_fingerprint(versioned, version_meta_key="content_version") != (
        request_fingerprint(
            Request(url, meta={"content_version": 4}), version_meta_key="content_version"
        )
    )
    # No key configured, key absent or None: plain Scrapy fingerprint.
    plain = scrapy_fingerprint(Request(url))
    assert request_fingerprint(versioned) == plain
    assert request_fingerprint(Request(url), version_meta_key="content_version") == plain
    assert (
        request_fingerprint(
            Request(url, meta={"content_version": None}), version_meta_key="content_version"
        )
        == plain
    )
    post = Request(url, method="POST", body=b"x", meta={"v": "abc"})
    assert request_fingerprint(post, version_meta_key="v") == fingerprint(
        url, "POST", b"x", version="abc"
    )


def test_request_fingerprint_with_canonicalizer() -> None:
    canonicalizer = Canonicalizer()
    a = Request("http://example.com:80/p?utm_source=x&id=1")
    b = Request("http://example.com/p?id=1")
    assert request_fingerprint(a) != request_fingerprint(b)
    assert request_fingerprint(a, canonicalizer=canonicalizer) == request_fingerprint(
        b, canonicalizer=canonicalizer
    )
    assert request_fingerprint(a, canonicalizer=canonicalizer) == fingerprint(
        a.url, canonicalizer=canonicalizer
    )


# ------------------------------------------------------------------------ canonicalizer


def test_default_tracking_params() -> None:
    for name in ("utm_*", "spm", "gclid", "fbclid", "yclid", "mc_cid", "mc_eid", "_hsenc"):
        assert name in DEFAULT_TRACKING_PARAMS
    for name in ("_hsmi", "ref_src", "igshid", "msclkid"):
        assert name in DEFAULT_TRACKING_PARAMS
    assert Canonicalizer().drop_params == DEFAULT_TRACKING_PARAMS


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "http://example.com/p?utm_source=a&UTM_Medium=b&spm=1.2&gclid=x&id=7&ref=home",
            "http://example.com/p?id=7&ref=home",
        ),
        # Matching happens on decoded names.
        ("http://example.com/p?utm%5Fsource=a&%55TM_campaign=b&id=7", "http://example.com/p?id=7"),
        # Near misses are not tracking parameters.
        (
            "http://example.com/p?utmost=1&spmx=2&xgclid=3&gclid_=4&utm=5",
            "http://example.com/p?gclid_=4&spmx=2&utm=5&utmost=1&xgclid=3",
        ),
        # Repeated parameters are kept, sorted like w3lib (by name, then value).
        ("http://example.com/p?b=2&a=2&utm_x=1&a=1", "http://example.com/p?a=1&a=2&b=2"),
        # A URL that loses every parameter has no "?".
        ("http://example.com/p?utm_source=x&fbclid=y", "http://example.com/p"),
        ("http://example.com/p?utm_source=x%20y&fbclid=%E2%82%AC", "http://example.com/p"),
        ("http://example.com?gclid=1", "http://example.com/"),
        # Percent-encoding is normalised like w3lib's canonicalize_url.
        (
            "http://Example.com/a%7eb/%e2%82%ac/r\u00e9sum\u00e9?q=%7e&r=a%20b&utm_term=x",
            "http://example.com/a~b/%E2%82%AC/r%C3%A9sum%C3%A9?q=~&r=a+b",
        ),
        ("http://example.com/a/./b/../c?x=1", "http://example.com/a/c?x=1"),
    ],
)
def test_canonicalize_drops_tracking_params(url: str, expected: str) -> None:
    assert Canonicalizer().canonicalize(url) == expected


@pytest.mark.parametrize(
    ("options", "url", "expected"),
    [
        ({}, "HTTP://WWW.Example.COM/Path?Q=A", "http://www.example.com/Path?Q=A"),
        ({}, "http://WWW.Example.COM/Path", "http://www.example.com/Path"),
        (
            {"lowercase_host": False},
            "HTTP://WWW.Example.COM/Path?Q=A",
            "HTTP://WWW.Example.COM/Path?Q=A",
        ),
        ({"lowercase_host": False}, "http://WWW.Example.COM/Path", "http://WWW.Example.COM/Path"),
        ({"lowercase_host": False}, "http://WWW.Example.COM/%7e", "http://WWW.Example.COM/~"),
        ({}, "http://example.com:80/", "http://example.com/"),
        ({}, "https://example.com:443/a", "https://example.com/a"),
        ({}, "HTTPS://example.com:443/a%20", "https://example.com/a%20"),
        ({}, "http://example.com:443/", "http://example.com:443/"),
        ({}, "https://example.com:80/", "https://example.com:80/"),
        ({}, "http://example.com:8080/", "http://example.com:8080/"),
        ({}, "http://example.com:180/", "http://example.com:180/"),
        ({"strip_default_port": False}, "http://example.com:80/", "http://example.com:80/"),
        ({}, "http://www.example.com/", "http://www.example.com/"),
        ({"strip_www": True}, "http://www.example.com/", "http://example.com/"),
        ({"strip_www": True}, "http://www.example.com:8080/", "http://example.com:8080/"),
        ({"strip_www": True}, "http://www.com/", "http://www.com/"),
        ({"strip_www": True}, "http://wwwexample.com/", "http://wwwexample.com/"),
        (
            {"strip_www": True, "lowercase_host": False},
            "http://WWW.Example.com/",
            "http://Example.com/",
        ),
        ({}, "http://example.com/p#frag", "http://example.com/p"),
        (
            {"drop_fragment": False},
            "http://example.com/p?b=1&a=2#frag",
            "http://example.com/p?a=2&b=1#frag",
        ),
        ({"drop_fragment": False}, "http://example.com/p#fr ag", "http://example.com/p#fr%20ag"),
        ({}, "http://example.com/p?b=1&a=2&a=1", "http://example.com/p?a=1&a=2&b=1"),
        (
            {"sort_query": False},
            "http://example.com/p?b=1&a=2&a=1",
            "http://example.com/p?b=1&a=2&a=1",
        ),
        (
            {"sort_query": False},
            "http://example.com/p%20?b=%7e&utm_source=x&a=2",
            "http://example.com/p%20?b=~&a=2",
        ),
        ({}, "http://example.com/a/", "http://example.com/a/"),
        ({"strip_trailing_slash": True}, "http://example.com/a/", "http://example.com/a"),
        ({"strip_trailing_slash": True}, "http://example.com/a//?x=1", "http://example.com/a?x=1"),
        ({"strip_trailing_slash": True}, "http://example.com/", "http://example.com/"),
        ({"strip_trailing_slash": True}, "http://example.com", "http://example.com/"),
        ({"strip_trailing_slash": True}, "http://example.com/a%20/", "http://example.com/a%20"),
        ({}, "http://example.com/?a=&b=1&c", "http://example.com/?a=&b=1&c="),
        ({"remove_empty_params": True}, "http://example.com/?a=&b=1&c", "http://example.com/?b=1"),
        (
            {"remove_empty_params": True},
            "http://example.com/?a=&b=%20&c%20",
            "http://example.com/?b=+",
        ),
        ({"remove_empty_params": True}, "http://example.com/?a=&c", "http://example.com/"),
        (
            {"drop_params": ()},
            "http://example.com/?utm_source=x",
            "http://example.com/?utm_source=x",
        ),
    ],
)
def test_canonicalizer_options(options: dict[str, Any], url: str, expected: str) -> None:
    canonicalizer = Canonicalizer(**options)
    assert canonicalizer.canonicalize(url) == expected
    assert canonicalizer.canonicalize(expected) == expected


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1/",
        "http://example.com:99999/",
        "not a url",
        "",
        "mailto:someone@example.com?subject=hi&utm_source=x",
        "javascript:void(0)",
        "data:text/plain,hello",
    ],
)
def test_canonicalize_never_raises(url: str) -> None:
    result = Canonicalizer().canonicalize(url)
    assert isinstance(result, str)
    assert "utm_source" not in result


def test_canonicalize_invalid_url_is_returned_unchanged() -> None:
    assert Canonicalizer().canonicalize("http://[::1/") == "http://[::1/"
    assert Canonicalizer().canonicalize("http://example.com:99999/") == "http://example.com:99999/"


_NEUTRAL = Canonicalizer(drop_params=(), strip_default_port=False)

canonicalizers = st.builds(
    Canonicalizer,
    drop_params=st.sampled_from([DEFAULT_TRACKING_PARAMS, (), ("a", "[ab]*", "q?")]),
    lowercase_host=st.booleans(),
    strip_default_port=st.booleans(),
    strip_www=st.booleans(),
    drop_fragment=st.booleans(),
    sort_query=st.booleans(),
    strip_trailing_slash=st.booleans(),
    remove_empty_params=st.booleans(),
)


@HYPOTHESIS
@given(url=st.one_of(urls, simple_urls))
def test_neutral_canonicalizer_equals_w3lib(url: str) -> None:
    try:
        expected = canonicalize_url(safe_url_string(url))
    except ValueError:
        assert _NEUTRAL.canonicalize(url) == url
        return
    assert _NEUTRAL.canonicalize(url) == expected


@HYPOTHESIS
@given(url=simple_urls, canonicalizer=canonicalizers)
def test_canonicalizer_fast_path_equals_w3lib_path(url: str, canonicalizer: Canonicalizer) -> None:
    assert canonicalizer.canonicalize(url) == canonicalizer._canonicalize_w3lib(url)


@HYPOTHESIS
@given(url=st.one_of(urls, simple_urls), canonicalizer=canonicalizers)
@example(url="http://www.example.com:80/a//?utm_source=x&b=&a=1#f", canonicalizer=Canonicalizer())
def test_canonicalize_is_idempotent(url: str, canonicalizer: Canonicalizer) -> None:
    once = canonicalizer.canonicalize(url)
    assert canonicalizer.canonicalize(once) == once


@HYPOTHESIS
@given(url=urls)
def test_canonicalize_drops_every_tracking_param(url: str) -> None:
    try:  # a URL Scrapy itself would reject (e.g. port 65536) is returned unchanged
        scrapy.Request(url)
    except ValueError:
        return
    result = Canonicalizer().canonicalize(url)
    query = result.partition("#")[0].partition("?")[2]
    names = {field.partition("=")[0].lower() for field in query.split("&") if field}
    assert not names & {"utm_source", "utm_medium", "utm%5fcampaign", "spm", "gclid"}


def test_fingerprints_with_and_without_canonicalizer() -> None:
    canonicalizer = Canonicalizer()
    base = "http://example.com/p?a=1&b=2"

    def same_with(url: str) -> bool:
        return fingerprint(url, canonicalizer=canonicalizer) == fingerprint(
            base, canonicalizer=canonicalizer
        )

    # Tracking parameters and default ports: Scrapy tells them apart, the canonicalizer not.
    for url in (
        "http://example.com/p?a=1&b=2&utm_source=news",
        "http://example.com/p?UTM_Medium=x&a=1&gclid=1&b=2&spm=9",
        "http://example.com:80/p?a=1&b=2",
    ):
        assert same_with(url)
        assert fingerprint(url) != fingerprint(base)
        assert fingerprint(url) == scrapy_fp(url)
    # Parameter order and host case: Scrapy already treats them as equal.
    for url in ("http://example.com/p?b=2&a=1", "http://EXAMPLE.com/p?a=1&b=2"):
        assert same_with(url)
        assert fingerprint(url) == fingerprint(base)
    # Different resources stay different.
    for url in (
        "http://example.com/p?a=1&b=3",
        "http://example.com/P?a=1&b=2",
        "https://example.com/p?a=1&b=2",
        "http://example.com:8080/p?a=1&b=2",
    ):
        assert not same_with(url)
    # Options beyond Scrapy's canonicalisation.
    slashy = Canonicalizer(strip_www=True, strip_trailing_slash=True)
    assert fingerprint("http://www.example.com/p/", canonicalizer=slashy) == fingerprint(
        "http://example.com/p", canonicalizer=slashy
    )
    assert fingerprint("http://www.example.com/p/") != fingerprint("http://example.com/p")


def test_fingerprint_with_canonicalizer_hashes_the_canonical_url() -> None:
    canonicalizer = Canonicalizer(strip_www=True)
    url = "http://www.Example.com:80/p?utm_source=x&b=2&a=1#f"
    assert fingerprint(url, canonicalizer=canonicalizer) == scrapy_fp(
        "http://example.com/p?a=1&b=2"
    )


# ------------------------------------------------------------------------- from_patterns


def test_from_patterns_string() -> None:
    canonicalizer = Canonicalizer.from_patterns(" utm_* , gclid,fbclid ")
    assert canonicalizer.drop_params == ("utm_*", "gclid", "fbclid")
    assert canonicalizer == Canonicalizer(drop_params=("utm_*", "gclid", "fbclid"))


def test_from_patterns_iterable_and_keywords() -> None:
    canonicalizer = Canonicalizer.from_patterns(
        (p for p in ["session*", "v[0-9]", "a?c"]), strip_www=True, sort_query=False
    )
    assert canonicalizer.drop_params == ("session*", "v[0-9]", "a?c")
    assert canonicalizer.strip_www and not canonicalizer.sort_query
    # The patterns replace the defaults.
    assert (
        canonicalizer.canonicalize(
            "http://www.example.com/?SessionID=1&utm_source=2&v1=3&v10=4&abc=5&ac=6"
        )
        == "http://example.com/?utm_source=2&v10=4&ac=6"
    )


@pytest.mark.parametrize(
    "patterns",
    [
        "",
        "utm_*,,gclid",
        "utm_*,",
        " , ",
        "utm source",
        "utm=*",
        "a,b;c",
        "caf\u00e9",
        "a/b",
        ["ok", ""],
        ["ok", "bad!"],
    ],
)
def test_from_patterns_rejects_bad_patterns(patterns: str | list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        Canonicalizer.from_patterns(patterns)
    assert info.value.setting == SETTING
    assert SETTING in str(info.value)
    assert isinstance(info.value, ValueError)


def test_constructor_validates_patterns() -> None:
    with pytest.raises(ConfigError):
        Canonicalizer(drop_params="utm_*")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        Canonicalizer(drop_params=("utm_*", "x y"))
    # A list is accepted and stored as a tuple (the instance stays hashable).
    canonicalizer = Canonicalizer(drop_params=["a", "b"])  # type: ignore[arg-type]
    assert canonicalizer.drop_params == ("a", "b")
    assert hash(canonicalizer) == hash(Canonicalizer(drop_params=("a", "b")))


def test_canonicalizer_is_frozen() -> None:
    canonicalizer = Canonicalizer()
    with pytest.raises(dataclasses.FrozenInstanceError):
        canonicalizer.strip_www = True  # type: ignore[misc]
    assert Canonicalizer() == Canonicalizer()
    assert Canonicalizer(strip_www=True) != Canonicalizer()


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:54321/product/7?utm_source=x&b=1",
        "http://127.0.0.1:65535/",
        "http://127.0.0.1:65536/",
        "https://example.com:99999/x",
    ],
)
def test_five_digit_ports_match_scrapy(url: str) -> None:
    from scrapy.utils.request import fingerprint as scrapy_fingerprint

    try:
        expected = scrapy_fingerprint(scrapy.Request(url))
    except ValueError:
        with pytest.raises(ValueError):
            fingerprint(url)
        return
    assert fingerprint(url) == expected


# ------------------------------------------------------- scrapy-redis mode (migrated crawls)


def scrapy_redis_fp(request: Request) -> bytes:
    """scrapy-redis 0.9.1's own fingerprint (its RFPDupeFilter, installed), as bytes."""
    from scrapy_redis.dupefilter import RFPDupeFilter

    return bytes.fromhex(RFPDupeFilter(None, "k").request_fingerprint(request))


@HYPOTHESIS
@given(
    url=st.one_of(urls, simple_urls),
    method=st.sampled_from(["GET", "POST", "put"]),
    body=st.binary(max_size=64),
    headers=st.dictionaries(
        st.sampled_from(["Accept", "X-Token"]), st.text(max_size=5), max_size=2
    ),
    verbatim=st.booleans(),
)
def test_scrapy_redis_mode_matches_scrapy_redis(
    url: str, method: str, body: bytes, headers: dict[str, str], verbatim: bool
) -> None:
    try:
        request = Request(
            url,
            method=method,
            body=body,
            headers=headers,
            meta={"verbatim_url": True} if verbatim else None,
        )
    except ValueError:
        return  # not a URL Scrapy makes a request of
    try:
        expected = scrapy_redis_fp(request)
    except ValueError:  # e.g. a port over 65535: scrapy-redis cannot fingerprint it either
        with pytest.raises(ValueError):
            request_fingerprint(request, mode="scrapy-redis")
        with pytest.raises(ValueError):
            fingerprint(url, method, body, headers, mode="scrapy-redis")
        return
    assert request_fingerprint(request, mode="scrapy-redis") == expected
    assert fingerprint(url, method, body, headers, mode="scrapy-redis") == expected
    # the two modes never agree on a request (the "headers" member differs)
    assert request_fingerprint(request) != expected


def test_scrapy_redis_mode_refuses_headers_and_fragments() -> None:
    with pytest.raises(ValueError, match="scrapy-redis"):
        fingerprint("http://a.example/", include_headers=["accept"], mode="scrapy-redis")
    with pytest.raises(ValueError, match="scrapy-redis"):
        fingerprint("http://a.example/", keep_fragments=True, mode="scrapy-redis")


def test_scrapy_redis_mode_with_version_adds_the_version() -> None:
    url = "http://example.com/item?id=1"
    plain = fingerprint(url, mode="scrapy-redis")
    assert fingerprint(url, version="2", mode="scrapy-redis") not in (
        plain,
        fingerprint(url, version="2"),
    )
