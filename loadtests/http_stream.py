"""One HTTP/1.1 POST whose response is read as server-sent events, on a socket of its own.

Ours rather than `requests`, because a client that hangs up must first take what the server
had already sent (`drain`): those tokens were produced while the client was still there, and
must not be mistaken for tokens decoded after it left. Plain sockets; gevent makes them
cooperative under Locust. `https` URLs are wrapped in TLS.
"""

from __future__ import annotations

import select
import socket
import ssl
from collections.abc import Iterator
from urllib.parse import urlsplit


class StreamError(Exception):
    """The response broke the protocol or the connection broke."""


class _Chunked:
    """Incremental decoder of `Transfer-Encoding: chunked`."""

    def __init__(self) -> None:
        self.buf = b""
        self.left = 0  # bytes of the current chunk still to come
        self.crlf = False  # the CRLF that ends a chunk's data is still to come
        self.done = False

    def feed(self, data: bytes) -> bytes:
        self.buf += data
        out = []
        while not self.done:
            if self.left:
                take = self.buf[: self.left]
                out.append(take)
                self.buf = self.buf[len(take) :]
                self.left -= len(take)
                if self.left:
                    break
                self.crlf = True
            if self.crlf:
                if len(self.buf) < 2:
                    break
                self.buf, self.crlf = self.buf[2:], False
            end = self.buf.find(b"\r\n")
            if end < 0:
                break
            try:
                size = int(self.buf[:end].split(b";")[0], 16)
            except ValueError:
                raise StreamError(f"bad chunk size {self.buf[:end][:40]!r}") from None
            self.buf = self.buf[end + 2 :]
            self.left = size
            self.done = size == 0
        return b"".join(out)


class SSEStream:
    """`POST path` with a JSON body; `events()` yields the payload of each `data:` line."""

    def __init__(self, base: str, path: str, body: bytes, headers: dict[str, str]) -> None:
        url = urlsplit(base)
        self.host, self.tls = url.hostname or "127.0.0.1", url.scheme == "https"
        self.port = url.port or (443 if self.tls else 80)
        self.request = (
            f"POST {url.path.rstrip('/')}{path} HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Content-Length: {len(body)}\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            + "\r\n"
        ).encode() + body
        self.sock: socket.socket | None = None
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self._raw = b""  # received, not yet decoded
        self._body = b""  # decoded, not yet split into lines
        self._chunked: _Chunked | None = None
        self._length: int | None = None  # Content-Length still to come, if the body has one
        self.eof = False

    def send(self, connect_timeout: float) -> None:
        sock = socket.create_connection((self.host, self.port), timeout=connect_timeout)
        if self.tls:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
        self.sock = sock
        sock.sendall(self.request)

    def read_head(self, timeout: float) -> None:
        assert self.sock is not None
        self.sock.settimeout(timeout)
        while self.status is None:
            if not self._recv():
                raise StreamError("connection closed before the response headers")

    def _parse_head(self) -> None:
        head, _, rest = self._raw.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        try:
            self.status = int(status_line.split()[1])
        except (IndexError, ValueError):
            raise StreamError(f"bad status line {status_line[:80]!r}") from None
        for line in lines:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            self._chunked = _Chunked()
        elif "content-length" in self.headers:
            self._length = int(self.headers["content-length"])
        self._raw = b""
        self._decode(rest)

    def body_text(self, timeout: float, limit: int = 4096) -> str:
        """The start of a (non-event) body, e.g. an error response."""
        assert self.sock is not None
        self.sock.settimeout(timeout)
        while len(self._body) < limit and not self._finished() and self._recv():
            pass
        return self._body[:limit].decode(errors="replace")

    def events(self, timeout: float) -> Iterator[bytes]:
        """`data:` payloads as they arrive; each read waits at most `timeout` seconds."""
        assert self.sock is not None
        self.sock.settimeout(timeout)
        while True:
            yield from self._lines()
            if self._finished() or not self._recv():
                yield from self._lines()
                return

    def drain(self) -> list[bytes]:
        """The `data:` payloads of whatever has already arrived, without waiting for more."""
        if self.sock is None:
            return []
        try:
            self.sock.settimeout(0.0)
            while not self._finished() and self._ready():
                if not self._recv():
                    break
        except (OSError, StreamError):
            pass
        return list(self._lines())

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()

    def _ready(self) -> bool:
        assert self.sock is not None
        if isinstance(self.sock, ssl.SSLSocket) and self.sock.pending():
            return True
        return bool(select.select([self.sock], [], [], 0)[0])

    def _recv(self) -> bool:
        assert self.sock is not None
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise StreamError("read timed out") from None
        except (BlockingIOError, ssl.SSLWantReadError):
            return False
        except OSError as e:
            raise StreamError(f"{type(e).__name__}: {e}") from None
        if not data:
            self.eof = True
            return False
        if self.status is None:
            self._raw += data
            if b"\r\n\r\n" in self._raw:
                self._parse_head()
        else:
            self._decode(data)
        return True

    def _decode(self, data: bytes) -> None:
        if self._chunked is not None:
            data = self._chunked.feed(data)
        elif self._length is not None:
            data = data[: self._length]
            self._length -= len(data)
        self._body += data

    def _finished(self) -> bool:
        return (
            self.eof
            or (self._chunked is not None and self._chunked.done)
            or (self._length is not None and self._length <= 0)
        )

    def _lines(self) -> Iterator[bytes]:
        while b"\n" in self._body:
            line, _, self._body = self._body.partition(b"\n")
            line = line.rstrip(b"\r")
            if line.startswith(b"data:"):
                yield line[5:].strip()
