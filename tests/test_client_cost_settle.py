"""Pipelined settle calls are packed straight through hiredis when the connection would
use it anyway (issue 16): the same bytes as redis-py's own packing, and redis-py's way
for whatever hiredis refuses."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from redis.connection import Connection

from redcrawl.frontier.settle import _hiredis_pack, _pack


def _joined(packed: list[bytes]) -> bytes:
    assert isinstance(packed, list)  # (send_packed_command sends each item)
    return b"".join(packed)


def _commands(*extra: Any) -> list[tuple[Any, ...]]:
    head = ("EVALSHA", "a" * 40, 2, "rc:{c}:req", "rc:{c}:ready")
    return [
        (*head, 3, 0, "w1", 30000, "", b"\x01nonce", b"2|0||\x83\xa1v\x01", bytes(20), -1, *extra),
        (*head, 0, 2, "", 0.5, "é", 10**18, b""),
    ]


def test_same_bytes_as_redis_py() -> None:
    conn = Connection()
    commands = _commands()
    assert _joined(_pack(conn, commands)) == _joined(conn.pack_commands(commands))
    if _hiredis_pack is None:
        pytest.skip("hiredis is not installed: redis-py's packing is used")


@pytest.mark.parametrize("odd", [memoryview(b"abc"), bytearray(b"abc")])
def test_what_hiredis_refuses_goes_redis_py_s_way(odd: Any) -> None:
    conn = Connection()
    assert _joined(_pack(conn, _commands(odd))) == _joined(conn.pack_commands(_commands(odd)))


@pytest.mark.parametrize("bad", [True, None])
def test_unstorable_arguments_raise_as_before(bad: Any) -> None:
    with pytest.raises(redis.exceptions.DataError):
        _pack(Connection(), _commands(bad))


def test_a_large_command_is_sent_alone_and_small_ones_together() -> None:
    """As redis-py's pack_commands: small commands joined in pieces of at most 6,000
    bytes, a larger one sent as it is (the batch is not copied into one bytes)."""
    conn = Connection()
    big = b"x" * 50_000
    commands = [*_commands(), *_commands(big), *_commands()]
    packed = _pack(conn, commands)
    assert _joined(packed) == _joined(conn.pack_commands(commands))
    if _hiredis_pack is not None:
        assert any(len(piece) > 50_000 for piece in packed)
        assert all(len(piece) <= 6000 for piece in packed if len(piece) < 50_000)


def test_a_hiredis_without_pack_command_falls_back_to_redis_py(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """redis-py 5.0 accepts a hiredis before 2.1, which has no pack_command (it then packs
    in Python itself): found by a review, the module failed to import there."""
    hiredis = pytest.importorskip("hiredis")
    from redcrawl.frontier import settle

    monkeypatch.delattr(hiredis, "pack_command", raising=False)
    assert settle._hiredis_packer() is None
    monkeypatch.setattr(redis.connection, "HIREDIS_PACK_AVAILABLE", False, raising=False)
    assert settle._hiredis_packer() is None
