"""The minimal RESP writer behind the Redis bus's pipelined publish, on a real socket pair fed in small pieces."""

from __future__ import annotations

import socket
import threading

import pytest

from meridian.bus.resp import RespSocket


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


def test_a_truncated_reply_closes_the_socket() -> None:
    ours, theirs = socket.socketpair()
    writer = RespSocket("redis://127.0.0.1:1/0", timeout_s=5, connect_timeout_s=5)
    writer._sock = ours

    def answer() -> None:
        theirs.recv(65536)
        theirs.sendall(b"$3\r\n1-0\r\n$3\r\n1-")  # the second reply is cut off
        theirs.close()

    threading.Thread(target=answer, daemon=True).start()
    with pytest.raises(ConnectionError):
        writer.xadd_many(b"s", [b"a", b"b"], maxlen=None)
    assert writer._sock is None
