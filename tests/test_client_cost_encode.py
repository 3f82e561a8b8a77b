"""encode reuses one msgpack packer per thread (issue 16): an error, a nested encode and
other threads leave the bytes as a fresh packer makes them."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import pytest

from redcrawl.envelope import Envelope, decode, encode
from redcrawl.errors import EncodeError

URL = "http://example.com/a"


def test_an_error_leaves_the_packer_clean() -> None:
    first = encode(Envelope(url=URL, meta={"k": 1}))
    with pytest.raises(EncodeError):
        encode(Envelope(url=URL, meta={"k": object()}))
    assert encode(Envelope(url=URL, meta={"k": 1})) == first


INNER = Envelope(url=URL + "/inner", meta={"x": [1, 2, 3]})
inner_bytes: list[bytes] = []


@dataclass
class Probe:
    """A value whose packing encodes another envelope (project code run mid-pack)."""

    value: Any

    def __getattribute__(self, name: str) -> Any:
        if name == "value":
            inner_bytes.append(encode(INNER))
        return object.__getattribute__(self, name)


def test_nested_encode_gets_its_own_packer() -> None:
    want = encode(INNER)
    inner_bytes.clear()
    env = decode(encode(Envelope(url=URL, meta={"p": Probe(5)})))
    assert inner_bytes == [want]
    assert env.url == URL and env.meta["p"].value == 5


def test_threads_encode_alike() -> None:
    envs = [Envelope(url=f"{URL}/{i}", meta={"i": i, "t": (i, i)}) for i in range(300)]
    want = [encode(e) for e in envs]
    got: list[list[bytes]] = [[] for _ in range(4)]

    def work(k: int) -> None:
        for _ in range(5):
            got[k] = [encode(e) for e in envs]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(g == want for g in got)


def test_a_large_envelope_does_not_pin_its_buffer_in_the_thread() -> None:
    """msgpack's packer never shrinks its buffer: after a large envelope (or a failed
    one) the thread's packer is dropped, not kept (found by a review: 8 threads that had
    each encoded one 7 MB envelope held 166 MB)."""
    from redcrawl import envelope

    encode(Envelope(url=URL))
    assert "p" in envelope._packers.__dict__  # kept after a small one
    encode(Envelope(url=URL, body=b"x" * 1_000_000))
    assert "p" not in envelope._packers.__dict__
    with pytest.raises(EncodeError):
        encode(Envelope(url=URL, meta={"k": object()}))
    assert "p" not in envelope._packers.__dict__
    encode(Envelope(url=URL))
    assert "p" in envelope._packers.__dict__
