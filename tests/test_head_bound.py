"""The request head's bound, in process: where a head ends, the option, and the cut.

``connlist.servers.heads.head_end`` against a simple model of a head (its
lines, one at a time), with hypothesis; ``max_header_size``'s validation;
``Enforcer.overflow`` on the fake clock, through the public views.  The
servers' reads are tested against real servers (``tests/test_head_limit.py``).
"""

from __future__ import annotations

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connlist.core.connections import connection_state
from connlist.core.enforcer import FEED_SLICE, Enforcer
from connlist.core.kinds import resolve
from connlist.observe.debug import snapshot
from connlist.servers.heads import head_end
from tests.fakes import RESPONSE_431, FakeClock, MemoryHandle, MockLoop

LINGER = 1.0


# -- where a head ends ---------------------------------------------------------------


def model_end(data: bytes, room: int) -> int:
    """The head's end, line by line: blank lines before it skipped, then lines up to the first blank one."""
    lines = data.splitlines(keepends=True)
    at = 0
    while at < len(lines) and lines[at] in (b"\r\n", b"\n"):
        at += 1
    start = sum(len(line) for line in lines[:at])
    end = start
    for line in lines[at:]:
        end += len(line)
        if line in (b"\r\n", b"\n") and end - start <= room:
            return end
        if line in (b"\r\n", b"\n") or end - start > room:
            return -1
    return -1


# Header lines of printable bytes (no CR or LF), each ended by CRLF or a bare LF.
line = st.tuples(
    st.binary(min_size=1, max_size=40).map(lambda b: bytes(c if c not in (10, 13) else 65 for c in b)),
    st.sampled_from([b"\r\n", b"\n"]),
).map(lambda pair: pair[0] + pair[1])


@given(
    blanks=st.lists(st.sampled_from([b"\r\n", b"\n"]), max_size=3),
    lines=st.lists(line, min_size=1, max_size=12),
    end=st.sampled_from([b"\r\n", b"\n", b""]),
    after=st.binary(max_size=60),
    room=st.integers(min_value=1, max_value=400),
)
def test_a_head_ends_where_its_first_blank_line_does(
    blanks: list[bytes], lines: list[bytes], end: bytes, after: bytes, room: int
) -> None:
    data = b"".join(blanks) + b"".join(lines) + end + after
    assert head_end(data, room, False) == model_end(data, room)


def test_a_head_begun_in_an_earlier_read_may_end_at_this_ones_start() -> None:
    # The rest of its blank line: the parser tells whether it was one.
    assert head_end(b"\r\nGET / HTTP/1.1\r\n\r\n", 100, True) == 2
    assert head_end(b"\nGET / HTTP/1.1\r\n\r\n", 100, True) == 1
    # At rest, blank lines before a request are not its head's end.
    assert head_end(b"\r\nGET / HTTP/1.1\r\n\r\n", 100, False) == 20
    assert head_end(b"X: y\r\n\r\n", 8, True) == 8
    assert head_end(b"X: y\r\n\r\n", 7, True) == -1


# -- the option ------------------------------------------------------------------------


def test_max_header_size_defaults_to_nodes() -> None:
    assert resolve().max_header_size == 16384
    assert resolve(max_header_size=0).max_header_size == 0  # the server's own limits only
    assert resolve(max_header_size=65536).max_header_size == 65536


@pytest.mark.parametrize("value", ["16k", 16384.0, True, None])
def test_max_header_size_of_another_type_is_a_type_error(value: object) -> None:
    with pytest.raises(TypeError, match=r"^max_header_size must be an int \(bytes\), got "):
        resolve(max_header_size=value)  # type: ignore[arg-type]


def test_a_negative_max_header_size_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"^max_header_size must be a number of bytes >= 0 .*got -1$"):
        resolve(max_header_size=-1)


def test_what_a_protocol_compares_a_read_with() -> None:
    assert Enforcer(resolve()).head_limit == 16384
    assert Enforcer(resolve()).whole_read == FEED_SLICE
    raised = Enforcer(resolve(max_header_size=65536))
    assert (raised.head_limit, raised.whole_read) == (65536, FEED_SLICE)
    lowered = Enforcer(resolve(max_header_size=4096))
    assert (lowered.head_limit, lowered.whole_read) == (4096, 4096)
    off = Enforcer(resolve(max_header_size=0))
    assert (off.head_limit, off.whole_read) == (sys.maxsize, FEED_SLICE)


# -- the cut ------------------------------------------------------------------------------


def test_an_overflow_is_answered_431_counted_and_aborted_after_the_linger(
    clock: FakeClock, loop: MockLoop
) -> None:
    enforcer = Enforcer(resolve(headers_timeout=5, request_timeout=10), clock=clock, loop=loop, linger=LINGER)
    handle = MemoryHandle()
    conn = enforcer.join(("127.0.0.1", 5000), handle=handle)
    enforcer.connections.message_begin(conn)
    enforcer.overflow(conn, handle.connlist_close_overflow)
    assert handle.transport.buffer == RESPONSE_431 and handle.transport.closed
    assert enforcer.totals.header_overflows == 1
    # Out of active: no headers timeout will cut it again; lingering, and aborted at the linger's end.
    assert enforcer.connections.active_count == 0
    assert connection_state(conn) == "timed_out"
    assert snapshot(enforcer)["totals"]["header_overflows"] == 1
    loop.run_until(clock() + LINGER + 0.1)
    assert handle.transport.aborted
    assert enforcer.totals.headers_timeouts == 0


def test_no_431_follows_a_response_already_under_way(clock: FakeClock, loop: MockLoop) -> None:
    enforcer = Enforcer(resolve(), clock=clock, loop=loop, linger=LINGER)
    handle = MemoryHandle()
    handle.responding = True
    conn = enforcer.join(("127.0.0.1", 5000), handle=handle)
    enforcer.overflow(conn, handle.connlist_close_overflow)
    assert handle.transport.buffer == b"" and handle.transport.closed
