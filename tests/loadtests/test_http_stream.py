"""The load tests' own SSE client: chunked decoding, and a hang-up that first takes what had
already arrived (so those tokens count as received, not as decoded for nobody)."""

from __future__ import annotations

import json
import select
import shutil
import socket
import ssl
import subprocess
import threading
import time

import pytest

from loadtests.client import Outcome, hang_up, stream
from loadtests.http_stream import SSEStream, _Chunked

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(payload: dict | str) -> bytes:
    text = payload if isinstance(payload, str) else json.dumps(payload)
    data = f"data: {text}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def token(n: int) -> bytes:
    return chunk({"choices": [{"text": " t"}], "usage": {"completion_tokens": n}})


def test_chunked_decoding_byte_by_byte():
    wire = chunk("a") + chunk("[DONE]") + b"0\r\n\r\n"
    d = _Chunked()
    body = b"".join(d.feed(wire[i : i + 1]) for i in range(len(wire)))
    assert body == b"data: a\n\ndata: [DONE]\n\n" and d.done


class OneResponse(threading.Thread):
    """A loopback server that answers one request with `first`, then `rest` once told to."""

    def __init__(self, first: bytes, rest: bytes, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(daemon=True)
        self.tls = tls
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.first, self.rest = first, rest
        self.go, self.closed = threading.Event(), threading.Event()

    def run(self) -> None:
        conn, _ = self.listener.accept()
        if self.tls is not None:
            conn = self.tls.wrap_socket(conn, server_side=True)
        with conn:
            conn.recv(65536)
            conn.sendall(self.first)
            self.go.wait(10)
            conn.sendall(self.rest)
            conn.settimeout(10)
            while conn.recv(65536):  # until the client hangs up
                pass
            self.closed.set()


def test_hang_up_takes_what_had_arrived_without_waiting():
    srv = OneResponse(HEAD + token(1), token(2) + token(3) + token(4))
    srv.start()
    s = SSEStream(srv.url, "/v1/completions", b"{}", {})
    s.send(5)
    s.read_head(5)
    out = Outcome("after-chunks", time.time())
    assert next(s.events(5)) and s.status == 200
    srv.go.set()
    # The three later events are in flight; the server never ends the stream, so a read would
    # block: hang_up must only take what is already there.
    assert select.select([s.sock], [], [], 10)[0], "the later events never arrived"
    deadline = time.monotonic() + 10
    while out.tokens != 4:
        assert time.monotonic() < deadline, f"drained {out.tokens} of 4 tokens"
        hang_up(out, s)
    assert out.exact and out.chunks == 3
    s.close()
    assert srv.closed.wait(10), "the server did not see the hang-up"


def test_stream_counts_chunks_where_the_server_sends_no_usage():
    plain = chunk({"choices": [{"text": " t"}]})
    srv = OneResponse(HEAD + plain * 3 + chunk("[DONE]") + b"0\r\n\r\n", b"")
    srv.go.set()
    srv.start()
    out = stream(Outcome("full", time.time()), srv.url, {"prompt": "x"})
    assert (out.outcome, out.tokens, out.exact, out.chunks) == ("complete", 3, False, 3)
    assert out.ttft is not None and len(out.gaps) == 2


def test_stream_reports_an_error_event_and_a_cut_stream():
    srv = OneResponse(HEAD + chunk({"error": {"message": "boom"}}), b"")
    srv.go.set()
    srv.start()
    out = stream(Outcome("full", time.time()), srv.url, {})
    assert out.outcome == "error" and "boom" in out.error

    srv = OneResponse(HEAD + token(1) + b"0\r\n\r\n", b"")
    srv.go.set()
    srv.start()
    out = stream(Outcome("full", time.time()), srv.url, {})
    assert out.outcome == "error" and "before [DONE]" in out.error and out.tokens == 1


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_https_stream(tmp_path, monkeypatch):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # trusted by ssl.create_default_context()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    srv = OneResponse(HEAD + token(1) + token(2) + chunk("[DONE]") + b"0\r\n\r\n", b"", ctx)
    srv.go.set()
    srv.start()
    out = stream(Outcome("full", time.time()), srv.url.replace("http:", "https:"), {})
    assert (out.outcome, out.tokens, out.exact) == ("complete", 2, True), out.error
