"""The client's lease path (issue 16, client CPU): the frontier builds each Lease of a
lease reply with :func:`~redcrawl.frontier.base.new_lease`, which must make the very
object the constructor makes."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from redcrawl.codec import Envelope
from redcrawl.frontier.base import Lease, new_lease

ENV = Envelope(url="http://example.com/a", callback="parse", priority=2)
FIELDS = (b"\x01" * 20, "17", "w1", 3, ENV, 12.5, 12.25)


def test_new_lease_is_the_constructors_lease() -> None:
    made, built = Lease(*FIELDS), new_lease(*FIELDS)
    assert type(built) is Lease
    assert built == made and repr(built) == repr(made)
    for f in dataclasses.fields(Lease):
        assert getattr(built, f.name) is getattr(made, f.name)


def test_new_lease_is_frozen_and_copies_as_a_lease() -> None:
    lease = new_lease(*FIELDS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        lease.token = "18"  # type: ignore[misc]
    for one in (lease, Lease(*FIELDS)):  # (Python 3.11's frozen slots: a TypeError)
        with pytest.raises((AttributeError, TypeError)):
            one.extra = 1  # type: ignore[attr-defined]
    assert dataclasses.replace(lease, attempts=4).attempts == 4
    assert copy.copy(lease) == lease
    assert pickle.loads(pickle.dumps(lease)) == lease
    # (received and granted are not compared: a copy with other times is equal)
    assert new_lease(*FIELDS[:5], 0.0, 0.0) == lease
