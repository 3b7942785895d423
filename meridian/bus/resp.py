"""A minimal RESP2 reader for the consumer's hot read, ``XREADGROUP`` of thousands of entries.

redis-py without hiredis parses replies element by element in Python, about 7 µs per stream entry —
more than decoding and applying the report it carries. This module holds one plain socket and
parses a ``XREADGROUP`` reply in a single pass over a buffer: two anchored regular-expression
matches and two slices per entry (about 1 µs per entry). It speaks only what that needs:
``AUTH``/``SELECT`` at connect, arrays, bulk strings, integers, simple strings, errors and nulls.
``rediss://`` wraps the socket in TLS at connect (:class:`~meridian.bus.connection.RedisEndpoint`
holds the CA, the optional client certificate and the host name check); parsing is the same, so
TLS costs the cipher and no per-entry work.

Hazards: no RESP3; one socket, so one thread at a time (the bus serialises callers with a lock); any
error mid-reply closes the socket, because the position in the reply stream is lost. Under TLS a
``recv`` returns at most one TLS record (16 KiB), so a large reply takes more, smaller reads.
"""

from __future__ import annotations

import re
import socket
from typing import Any

from meridian.bus.base import PAYLOAD_FIELD, StreamEntry
from meridian.bus.connection import RedisEndpoint, endpoint_from_url

_PAYLOAD = PAYLOAD_FIELD.encode()
_RECV_BYTES = 1 << 20
_ENTRY_HEAD = re.compile(rb"\*2\r\n\$(\d+)\r\n")
_PAYLOAD_HEAD = re.compile(rb"\*2\r\n\$%d\r\n%s\r\n\$(\d+)\r\n" % (len(_PAYLOAD), re.escape(_PAYLOAD)))


class RespError(Exception):
    """An error reply (``-ERR …``, ``-NOGROUP …``); the connection is still usable."""


class RespAuthError(ConnectionRefusedError):
    """The server refused ``AUTH``: wrong password, unknown or disabled user. Names the user, not the password."""


class RespSocket:
    def __init__(self, target: str | RedisEndpoint, *, timeout_s: float, connect_timeout_s: float) -> None:
        """``target``: a URL (credentials and TLS from it alone) or an endpoint with the process's settings."""
        endpoint = target if isinstance(target, RedisEndpoint) else endpoint_from_url(target)
        self.endpoint = endpoint
        self.url = endpoint.redacted_url
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        # Built once, so an unreadable CA or client certificate fails at start rather than at first use.
        self._tls = endpoint.ssl_context() if endpoint.tls else None
        self._sock: socket.socket | None = None
        self._buf = b""
        self._pos = 0

    # ------------------------------------------------------------------ connection
    def _connect(self) -> socket.socket:
        e = self.endpoint
        if e.scheme == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.connect_timeout_s)
            sock.connect(e.socket_path)
        else:
            sock = socket.create_connection((e.host, e.port), timeout=self.connect_timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                try:  # the handshake runs here, under the connect timeout
                    sock = self._tls.wrap_socket(sock, server_hostname=e.host)
                except BaseException:
                    sock.close()
                    raise
        sock.settimeout(self.timeout_s)
        self._sock, self._buf, self._pos = sock, b"", 0
        try:
            if e.password:
                self._roundtrip("AUTH", *([e.username, e.password] if e.username else [e.password]))
            if e.db:
                self._roundtrip("SELECT", e.db)
        except RespError as exc:  # as redis-py: a refused AUTH/SELECT is a connection failure
            self.close()
            if str(exc).startswith(("WRONGPASS", "NOAUTH", "ERR invalid password", "ERR AUTH")):
                raise RespAuthError(f"redis at {self.url} refused user {e.user!r}: {exc}") from None
            raise ConnectionRefusedError(f"redis at {self.url} refused the connection setup: {exc}") from exc
        except BaseException:
            self.close()
            raise
        return sock

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock, self._buf, self._pos = None, b"", 0

    # ------------------------------------------------------------------ wire
    @staticmethod
    def pack(*args: Any) -> bytes:
        parts = [b"*%d\r\n" % len(args)]
        for arg in args:
            value = arg if isinstance(arg, bytes) else str(arg).encode()
            parts.append(b"$%d\r\n%s\r\n" % (len(value), value))
        return b"".join(parts)

    def _fill(self) -> None:
        assert self._sock is not None
        chunk = self._sock.recv(_RECV_BYTES)
        if not chunk:
            raise ConnectionError("connection closed by server")
        if self._pos:
            self._buf = self._buf[self._pos:] + chunk
            self._pos = 0
        else:
            self._buf += chunk

    def _line(self) -> bytes:
        while True:
            end = self._buf.find(b"\r\n", self._pos)
            if end >= 0:
                line = self._buf[self._pos:end]
                self._pos = end + 2
                return line
            self._fill()

    def _bytes(self, n: int) -> bytes:
        while len(self._buf) - self._pos < n + 2:
            self._fill()
        value = self._buf[self._pos:self._pos + n]
        self._pos += n + 2
        return value

    def _reply(self) -> Any:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._bytes(n)
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._reply() for _ in range(n)]
        if kind == b":":
            return int(rest)
        if kind == b"+":
            return rest
        if kind == b"-":
            raise RespError(rest.decode(errors="replace"))
        raise ConnectionError(f"unexpected RESP type byte {kind!r}")

    def _roundtrip(self, *args: Any) -> Any:
        assert self._sock is not None
        self._sock.sendall(self.pack(*args))
        return self._reply()

    def _entry_slow(self) -> StreamEntry | None:
        """One entry of any shape, reading more from the socket as needed (``None``: deleted entry)."""
        line, take = self._line, self._bytes
        line()  # *2
        entry_id = take(int(line()[1:])).decode()
        header = line()
        if header == b"*-1":  # deleted entry still in a PEL
            return None
        payload = b""
        for _ in range(int(header[1:]) // 2):
            name = take(int(line()[1:]))
            size = int(line()[1:])
            value = take(size) if size >= 0 else b""
            if name == _PAYLOAD:
                payload = value
        return StreamEntry(entry_id, payload)

    def _entries(self) -> list[StreamEntry]:
        """The entries array of a stream: ``*N`` then ``*2 $id *2k field value …`` per entry.

        Fast path: two anchored regular-expression matches per entry on the buffer (the common
        shape, one field ``p``, entirely received). Anything else — an entry cut by the end of the
        buffer, more fields, a deleted entry — takes the general path for that entry.
        """
        n = int(self._line()[1:])
        out: list[StreamEntry] = []
        append = out.append
        head, payload_head = _ENTRY_HEAD.match, _PAYLOAD_HEAD.match
        for _ in range(n):
            buf, pos = self._buf, self._pos
            m = head(buf, pos)
            if m is not None:
                id_start = m.end()
                id_end = id_start + int(m.group(1))
                p = payload_head(buf, id_end + 2)
                if p is not None:
                    start = p.end()
                    stop = start + int(p.group(1))
                    if stop + 2 <= len(buf):
                        append(StreamEntry(buf[id_start:id_end].decode(), buf[start:stop]))
                        self._pos = stop + 2
                        continue
            entry = self._entry_slow()
            if entry is not None:
                append(entry)
        return out

    # ------------------------------------------------------------------ commands
    def xreadgroup(self, key: bytes, group: str, consumer: str, *, count: int,
                   block_ms: int | None) -> list[StreamEntry]:
        """Entries never delivered to ``group``; [] on timeout. Raises RespError (e.g. NOGROUP)."""
        sock = self._sock or self._connect()
        block = ("BLOCK", block_ms) if block_ms else ()
        try:
            sock.sendall(self.pack("XREADGROUP", "GROUP", group, consumer, "COUNT", count, *block, "STREAMS", key, ">"))
            head = self._line()
            if head[:1] == b"-":
                raise RespError(head[1:].decode(errors="replace"))
            if head in (b"*-1", b"*0"):
                return []
            # *1 streams → *2 [name, entries]
            self._line()  # *2
            self._bytes(int(self._line()[1:]))  # stream name
            entries = self._entries()
            if self._pos >= len(self._buf):
                self._buf, self._pos = b"", 0
            return entries
        except RespError:
            raise
        except BaseException:
            self.close()
            raise

    def xack(self, key: bytes, group: str, entry_ids: list[str]) -> int:
        """Acknowledge many entries in one command; returns how many were pending."""
        sock = self._sock or self._connect()
        head = self.pack("XACK", key, group)
        ids = b"".join([b"$%d\r\n%s\r\n" % (len(i), i.encode()) for i in entry_ids])
        try:
            sock.sendall(b"*%d%s%s" % (3 + len(entry_ids), head[head.index(b"\r\n"):], ids))
            reply = self._reply()
            if self._pos >= len(self._buf):
                self._buf, self._pos = b"", 0
            return int(reply)
        except RespError:
            raise
        except BaseException:
            self.close()
            raise

    def xadd_many(self, key: bytes, payloads: list[bytes], *, maxlen: int | None, chunk: int = 2000) -> list[str]:
        """Pipelined ``XADD key [MAXLEN ~ n] * p <payload>`` per payload; returns the error replies.

        Replies are consumed in bulk: a chunk's replies are whole lines in the buffer, counted by
        their first byte (``$`` id, ``-`` error) without building a Python object per reply.
        """
        sock = self._sock or self._connect()
        trim = b"$6\r\nMAXLEN\r\n$1\r\n~\r\n$%d\r\n%d\r\n" % (len(str(maxlen)), maxlen) if maxlen is not None else b""
        head = b"*%d\r\n$4\r\nXADD\r\n$%d\r\n%s\r\n%s$1\r\n*\r\n$%d\r\n%s\r\n" % (
            8 if maxlen is not None else 5, len(key), key, trim, len(_PAYLOAD), _PAYLOAD)
        errors: list[str] = []
        try:
            for start in range(0, len(payloads), chunk):
                part = payloads[start:start + chunk]
                sock.sendall(b"".join([b"%s$%d\r\n%s\r\n" % (head, len(p), p) for p in part]))
                errors.extend(self._skip_replies(len(part)))
        except BaseException:
            self.close()
            raise
        return errors

    def _skip_replies(self, count: int) -> list[str]:
        """Consume ``count`` bulk-string or error replies; returns the errors' texts."""
        errors: list[str] = []
        while count:
            buf, pos = self._buf, self._pos
            end = buf.rfind(b"\r\n")
            if end < pos:
                self._fill()
                continue
            lines = buf[pos:end].split(b"\r\n")
            i, used = 0, 0
            while i < len(lines) and count:
                kind = lines[i][:1]
                if kind == b"$":
                    if i + 1 >= len(lines):
                        break  # the id line has not arrived yet
                    used += len(lines[i]) + len(lines[i + 1]) + 4
                    i += 2
                elif kind == b"-":
                    errors.append(lines[i][1:].decode(errors="replace"))
                    used += len(lines[i]) + 2
                    i += 1
                else:
                    raise ConnectionError(f"unexpected XADD reply {lines[i][:40]!r}")
                count -= 1
            self._pos = pos + used
            if count:
                self._fill()
        if self._pos >= len(self._buf):
            self._buf, self._pos = b"", 0
        return errors
