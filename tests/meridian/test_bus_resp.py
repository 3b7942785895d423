"""The minimal RESP reader behind the Redis bus's hot read, on a real socket pair fed in small pieces."""

from __future__ import annotations

import socket
import threading

import pytest

from meridian.bus.base import StreamEntry
from meridian.bus.resp import RespError, RespSocket


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


def _entry(entry_id: bytes, *fields: bytes) -> bytes:
    return b"*2\r\n" + _bulk(entry_id) + b"*%d\r\n" % len(fields) + b"".join(_bulk(f) for f in fields)


def _reply(*entries: bytes) -> bytes:
    return b"*1\r\n*2\r\n" + _bulk(b"s") + b"*%d\r\n" % len(entries) + b"".join(entries)


def _serve(reply: bytes, piece: int) -> RespSocket:
    """A RespSocket whose server end answers any request with ``reply``, ``piece`` bytes at a time."""
    ours, theirs = socket.socketpair()
    reader = RespSocket("redis://127.0.0.1:1/0", timeout_s=5, connect_timeout_s=5)
    reader._sock = ours  # connected already: skip TCP connect, keep the real parser

    def answer() -> None:
        theirs.recv(65536)
        for i in range(0, len(reply), piece):
            theirs.sendall(reply[i:i + piece])
        theirs.close()

    threading.Thread(target=answer, daemon=True).start()
    return reader


PAYLOADS = [b"\r\n*2\r\n$1\r\np\r\n", bytes(range(256)) * 50, b"", b"x" * 70_000]


@pytest.mark.parametrize("piece", [pytest.param(7, id="tiny-pieces"), pytest.param(1 << 20, id="one-piece")])
@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        pytest.param([_entry(b"1-%d" % i, b"p", p) for i, p in enumerate(PAYLOADS)],
                     [StreamEntry(f"1-{i}", p) for i, p in enumerate(PAYLOADS)], id="payloads-that-look-like-resp"),
        pytest.param([_entry(b"2-0", b"reason", b"bad", b"p", b"body"), _entry(b"2-1", b"p", b"ok")],
                     [StreamEntry("2-0", b"body"), StreamEntry("2-1", b"ok")], id="extra-fields"),
        pytest.param([b"*2\r\n" + _bulk(b"3-0") + b"*-1\r\n", _entry(b"3-1", b"p", b"kept")],
                     [StreamEntry("3-1", b"kept")], id="deleted-entry-skipped"),
    ],
)
def test_entries_parse_whatever_the_chunking(piece: int, entries: list[bytes], expected: list[StreamEntry]) -> None:
    reader = _serve(_reply(*entries), piece)
    assert reader.xreadgroup(b"s", "g", "c", count=10, block_ms=None) == expected
    reader.close()


@pytest.mark.parametrize(
    ("reply", "expected"),
    [pytest.param(b"*-1\r\n", [], id="timeout-null"), pytest.param(b"*0\r\n", [], id="empty")],
)
def test_empty_replies(reply: bytes, expected: list[StreamEntry]) -> None:
    assert _serve(reply, 100).xreadgroup(b"s", "g", "c", count=10, block_ms=100) == expected


def test_error_reply_keeps_the_connection() -> None:
    reader = _serve(b"-NOGROUP No such key 's' or consumer group 'g'\r\n", 100)
    with pytest.raises(RespError, match="NOGROUP"):
        reader.xreadgroup(b"s", "g", "c", count=10, block_ms=None)
    assert reader._sock is not None


def test_truncated_reply_closes_the_socket() -> None:
    reader = _serve(_reply(_entry(b"1-0", b"p", b"abcdef"))[:-5], 100)
    with pytest.raises(ConnectionError):
        reader.xreadgroup(b"s", "g", "c", count=10, block_ms=None)
    assert reader._sock is None


@pytest.mark.parametrize("piece", [pytest.param(3, id="tiny-pieces"), pytest.param(1 << 20, id="one-piece")])
def test_pipelined_xadd_replies_are_all_consumed_and_errors_reported(piece: int) -> None:
    replies = b"$3\r\n1-0\r\n-WRONGTYPE Operation against a key holding the wrong kind of value\r\n$3\r\n1-2\r\n"
    ours, theirs = socket.socketpair()
    writer = RespSocket("redis://127.0.0.1:1/0", timeout_s=5, connect_timeout_s=5)
    writer._sock = ours
    received = bytearray()

    def answer() -> None:
        while received.count(b"XADD") < 3:
            received.extend(theirs.recv(65536))
        for i in range(0, len(replies), piece):
            theirs.sendall(replies[i:i + piece])

    threading.Thread(target=answer, daemon=True).start()
    errors = writer.xadd_many(b"s", [b"a", b"b\r\n", b"c"], maxlen=100)
    assert errors == ["WRONGTYPE Operation against a key holding the wrong kind of value"]
    assert b"$6\r\nMAXLEN\r\n$1\r\n~\r\n$3\r\n100\r\n" in received and b"$3\r\nb\r\n\r\n" in received
    assert writer._buf == b"" and writer._pos == 0  # nothing left over to confuse the next command
    writer.close()
