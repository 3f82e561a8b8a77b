"""The politeness key: Scrapy's downloader slot key, with the bad inputs made well-defined
(the table in docs/politeness.md, one test per row)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scrapy import Request
from scrapy.core.downloader import Downloader
from scrapy.utils.httpobj import urlparse_cached

from redcrawl.politeness import MAX_KEY_BYTES, politeness_key, registrable_domain


def scrapy_slot_key(url: str, download_slot: str | None = None) -> str:
    """What Scrapy 2.x's ``Downloader.get_slot_key`` computes for this request (without
    ``CONCURRENT_REQUESTS_PER_IP``): the code is two lines, repeated here so no crawler
    needs to be built."""
    request = Request(
        url, meta={} if download_slot is None else {Downloader.DOWNLOAD_SLOT: download_slot}
    )
    meta_slot = request.meta.get(Downloader.DOWNLOAD_SLOT)
    if meta_slot is not None:
        return str(meta_slot)
    return urlparse_cached(request).hostname or ""


def test_scrapy_slot_key_is_what_the_downloader_does() -> None:
    # the copy above must follow Scrapy: check its source still says what we copied
    import inspect

    src = inspect.getsource(Downloader.get_slot_key)
    assert "urlparse_cached(request).hostname" in src and "DOWNLOAD_SLOT" in src


@pytest.mark.parametrize(
    "url, key",
    [
        ("http://example.com/a", "example.com"),
        ("https://example.com:8443/a?b=c", "example.com"),
        ("http://127.0.0.2:8080/", "127.0.0.2"),
    ],
)
def test_a_plain_url_gives_its_host_without_port(url: str, key: str) -> None:
    assert politeness_key(url) == key == scrapy_slot_key(url)


def test_uppercase_host_is_lowercased() -> None:
    assert politeness_key("http://WWW.Example.COM/Path") == "www.example.com"
    assert scrapy_slot_key("http://WWW.Example.COM/Path") == "www.example.com"


def test_host_with_port_and_credentials_gives_the_host() -> None:
    assert politeness_key("https://user:pw@Host.example:9000/x") == "host.example"


@pytest.mark.parametrize(
    "url, key",
    [
        ("http://bücher.de/x", "xn--bcher-kva.de"),
        ("http://BÜCHER.de/x", "xn--bcher-kva.de"),
        ("http://xn--bcher-kva.de/x", "xn--bcher-kva.de"),
        ("http://例え.テスト/", "xn--r8jz45g.xn--zckzah"),
        ("http://faß.de/", "fass.de"),  # IDNA 2003 mapping, as w3lib and Scrapy do
        ("http://\uff41\uff42\uff43.com/", "abc.com"),  # full-width letters, NFKC
    ],
)
def test_idna_host_is_punycode_as_scrapy_encodes_it(url: str, key: str) -> None:
    assert politeness_key(url) == key == scrapy_slot_key(url)


@pytest.mark.parametrize(
    "url, key",
    [
        ("http://[::1]:8080/", "::1"),
        ("http://[2001:DB8::1]/", "2001:db8::1"),
        ("http://[2001:0db8:0000::0001]/", "2001:db8::1"),  # Scrapy: '2001:0db8:0000::0001'
        ("http://[fe80::1%25eth0]/", "fe80::1%25eth0"),
    ],
)
def test_ipv6_literal_is_compressed_without_brackets(url: str, key: str) -> None:
    assert politeness_key(url) == key


def test_ipv6_key_matches_scrapy_for_the_usual_spelling() -> None:
    assert politeness_key("http://[::1]:8080/") == scrapy_slot_key("http://[::1]:8080/")


def test_trailing_dot_is_the_same_site() -> None:
    # Scrapy gives 'example.com.' its own slot; it is the same site, so not here
    assert politeness_key("http://example.com./") == "example.com"
    assert politeness_key("http://Example.Com.:81/") == politeness_key("http://example.com/")
    assert scrapy_slot_key("http://example.com./") == "example.com."


@pytest.mark.parametrize(
    "url, key",
    [
        ("data:text/plain,hi", "data:"),
        ("file:///etc/hosts", "file:"),
        ("about:blank", "about:"),
        ("http:///no-host", "http:"),
        ("/relative/path", "none:"),
    ],
)
def test_url_without_host_gets_its_scheme_as_key(url: str, key: str) -> None:
    # Scrapy puts them all in one slot named ''; an empty key would be awkward in Redis,
    # the API and the CLI, and 'scheme:' can never be a host name
    assert politeness_key(url) == key


def test_invalid_url_is_refused_with_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"not a valid URL.*download_slot"):
        politeness_key("http://[::1/")


def test_download_slot_wins_verbatim_in_both_modes() -> None:
    url = "http://www.example.co.uk/"
    assert politeness_key(url, download_slot="My Slot") == "My Slot"
    assert politeness_key(url, download_slot="My Slot", mode="domain") == "My Slot"
    assert politeness_key(url, download_slot="") == "" == scrapy_slot_key(url, "")
    assert scrapy_slot_key(url, "My Slot") == "My Slot"


def test_download_slot_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(TypeError, match="give the slot a string name"):
        politeness_key("http://a.com/", download_slot=7)


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="use 'host' or 'domain'"):
        politeness_key("http://a.com/", mode="ip")  # type: ignore[arg-type]


def test_pathological_download_slot_is_bounded_and_stable() -> None:
    slot = "Z" * 10_000
    key = politeness_key("http://a.com/", download_slot=slot)
    assert len(key.encode()) <= MAX_KEY_BYTES
    assert key.startswith("Z" * 64 + "~")
    assert key == politeness_key("http://b.com/", download_slot=slot)  # deterministic
    assert key != politeness_key("http://a.com/", download_slot=slot + "Z")


def test_pathological_host_is_bounded() -> None:
    key = politeness_key("http://" + "a" * 10_000 + ".com/")
    assert len(key.encode()) <= MAX_KEY_BYTES


def test_keys_at_the_bound_are_kept_and_multibyte_keys_are_measured_in_bytes() -> None:
    assert politeness_key("http://a/", download_slot="x" * MAX_KEY_BYTES) == "x" * MAX_KEY_BYTES
    assert len(politeness_key("http://a/", download_slot="x" * (MAX_KEY_BYTES + 1))) == 97
    wide = "é" * 128  # 128 characters, 256 bytes
    assert politeness_key("http://a/", download_slot=wide) == "é" * 32 + "~" + blake(wide)
    assert politeness_key("http://a/", download_slot="é" * 127) == "é" * 127


@pytest.mark.parametrize(
    "slot", ["\U0001f600" * 300, "a" + "\U0001f600" * 80, "\udcff" * 300, "x" * 100_000]
)
def test_bounded_in_bytes_whatever_the_characters(slot: str) -> None:
    key = politeness_key("http://a/", download_slot=slot)
    raw = key.encode("utf-8", "surrogatepass")
    assert len(raw) <= 97
    assert key.endswith("~" + blake(slot))


def blake(key: str) -> str:
    import hashlib

    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


@pytest.mark.parametrize(
    "host, domain",
    [
        ("www.example.co.uk", "example.co.uk"),
        ("a.b.example.com", "example.com"),
        ("example.com", "example.com"),
        ("xn--bcher-kva.de", "xn--bcher-kva.de"),
        ("shop.xn--bcher-kva.de", "xn--bcher-kva.de"),
        ("user.github.io", "github.io"),  # ICANN section only: private suffixes group
        ("localhost", "localhost"),  # no public suffix: the host itself
        ("foo.intranet", "foo.intranet"),
        ("127.0.0.2", "127.0.0.2"),
        ("::1", "::1"),
        ("Example.COM.", "example.com"),
    ],
)
def test_registrable_domain(host: str, domain: str) -> None:
    assert registrable_domain(host) == domain


def test_domain_mode_groups_hosts_of_one_site() -> None:
    keys = {
        politeness_key(u, mode="domain")
        for u in (
            "http://www.example.co.uk/",
            "https://shop.example.co.uk:8443/x",
            "http://EXAMPLE.co.uk./",
        )
    }
    assert keys == {"example.co.uk"}
    assert politeness_key("http://[::1]:80/", mode="domain") == "::1"
    assert politeness_key("data:,x", mode="domain") == "data:"


def test_domain_mode_never_touches_the_network(tmp_path: object) -> None:
    # a fresh interpreter with every socket refused: the bundled snapshot must suffice
    code = (
        "import socket\n"
        "def refuse(*a, **k): raise OSError('network used')\n"
        "socket.socket.connect = refuse; socket.create_connection = refuse\n"
        "socket.getaddrinfo = refuse\n"
        "from redcrawl.politeness import politeness_key\n"
        "assert politeness_key('http://a.b.example.co.uk/', mode='domain') == 'example.co.uk'\n"
    )
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": ":".join(sys.path)},
    )
    assert result.returncode == 0, result.stderr


_label = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-",
    min_size=1,
    max_size=12,
).filter(lambda s: not s.startswith("-") and not s.endswith("-"))
_unicode_label = st.text(alphabet="abcdeüöäßéçñ", min_size=1, max_size=10)


@settings(max_examples=300, deadline=None)
@given(
    labels=st.lists(st.one_of(_label, _unicode_label), min_size=1, max_size=4),
    tld=st.sampled_from(["com", "de", "co.uk", "COM", "org"]),
    port=st.one_of(st.none(), st.integers(1, 65535)),
    path=st.sampled_from(["", "/", "/a/b?c=d", "/ü?x=ä#f"]),
    scheme=st.sampled_from(["http", "https", "HTTP"]),
)
def test_same_key_as_scrapys_downloader(
    labels: list[str], tld: str, port: int | None, path: str, scheme: str
) -> None:
    host = ".".join([*labels, tld])
    url = f"{scheme}://{host}{'' if port is None else f':{port}'}{path}"
    try:
        expected = scrapy_slot_key(url)
    except (ValueError, UnicodeError):
        return  # Scrapy refuses the URL: nothing to compare
    assert politeness_key(url) == expected


def test_public_surface() -> None:
    import redcrawl.politeness as pkg

    for name in pkg.__all__:
        assert hasattr(pkg, name), name
    # the package knows nothing of Scrapy or Redis
    import ast
    from pathlib import Path

    for path in Path(pkg.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        modules = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        }
        modules |= {
            node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
        }
        assert not {m for m in modules if m.split(".")[0] in ("scrapy", "redis", "twisted")}, path


def test_url_that_cannot_be_encoded_is_refused_with_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"not a valid URL.*download_slot"):
        politeness_key("http://a\udcff.com/")  # a lone surrogate: no UTF-8 for it
