"""The client's fast paths for reading stored requests (issue 16) read what the general
ones read: the blank envelope decode starts from, and a record's header and body."""

from __future__ import annotations

import dataclasses

import pytest

from redcrawl.envelope import Envelope, blank, decode, encode
from redcrawl.errors import DecodeError
from redcrawl.frontier.records import from_record, parse_record, push_time

URL = "http://example.com/a?b=1"


def test_blank_is_envelope_with_defaults() -> None:
    env = blank(URL)
    made = Envelope(url=URL)
    for name in Envelope.__slots__:  # every field set, including those not compared
        assert getattr(env, name) == getattr(made, name), name
    for f in dataclasses.fields(Envelope):
        if f.default_factory is not dataclasses.MISSING:  # a container of its own
            assert getattr(env, f.name) is not getattr(blank(URL), f.name)


@pytest.mark.parametrize(
    "env",
    [
        Envelope(url=URL),
        Envelope(url=URL, callback="parse_item", priority=-3, fingerprint=bytes(20)),
        Envelope(url=URL, headers=[(b"Accept", [b"a", b"b"])], flags=["x"], cb_kwargs={"p": 2}),
        Envelope(url=URL, method="POST", body=b"k=v", meta={"depth": 1}, dont_filter=True),
    ],
)
def test_decode_round_trip(env: Envelope) -> None:
    assert decode(encode(env)) == env


@pytest.mark.parametrize(
    "data",
    [
        encode(Envelope(url=URL))[:1] + b"\x91\x01",  # a map of the wrong size
        b"\x91\x01",  # a list
        b"\x82\xa1v\x01\xa1u\x01",  # URL not a string
        b"\x83\xa1v\x01\xa1u\xa1x\xa1p\xc3",  # priority a bool
        b"\x83\xa1v\x01\xa1u\xa1x\xa1h\x91\x01",  # malformed headers
        b"\x83\xa1v\x01\xa1u\xa1x\xa2fl\x91\x01",  # a flag not a string
        b"\x83\xa1v\x01\xa1u\xa1x\xa1k\x81\x01\x01",  # a cb_kwargs key not a string
    ],
)
def test_decode_refuses(data: bytes) -> None:
    with pytest.raises(DecodeError):
        decode(data)


BODY = encode(Envelope(url=URL, priority=2), fingerprint=False)
STAMP = b"\x7f0000abc"


@pytest.mark.parametrize(
    ("rec", "head", "body"),
    [
        (b"2|0||" + BODY, (2, 0, ""), BODY),
        (b"-7|12|345|" + BODY + STAMP, (-7, 12, "345"), BODY),
        (b"2|0||K11:example.com" + BODY + STAMP, (2, 0, ""), BODY),
        (b"2|0||k3:a|b" + BODY, (2, 0, ""), BODY),  # (a key may hold "|")
        (b"2|0||" + STAMP, (2, 0, ""), b""),
        (b"2|0||\x7f0000ab", (2, 0, ""), b"\x7f0000ab"),  # too short to be a stamp
    ],
)
def test_record_parts(rec: bytes, head: tuple[int, int, str], body: bytes) -> None:
    assert parse_record(rec) == (*head, body)
    if body == BODY:
        assert from_record(rec) == decode(body)
    assert push_time(rec) is not None or not rec.endswith(STAMP)


@pytest.mark.parametrize(
    "rec",
    [
        b"",
        b"2|0|" + BODY,  # three fields
        b"x|0||" + BODY,
        b"2|-1||" + BODY,
        b"1234567890123456|0||" + BODY,  # past 15 digits
        b"2|0|\xff|" + BODY,  # a token that is not text
        b"2|0||" + BODY[:-1],  # the envelope cut short
    ],
)
def test_corrupt_records_refused(rec: bytes) -> None:
    with pytest.raises(DecodeError):
        from_record(rec)
    if rec != b"2|0||" + BODY[:-1]:
        with pytest.raises(DecodeError):
            parse_record(rec)
