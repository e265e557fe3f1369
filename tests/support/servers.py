"""Real alert receivers on 127.0.0.1 for the tests: an HTTP server for the webhook and a small SMTP server.

Both bind an ephemeral port, serve from a daemon thread and record what they receive (the request or mail is
recorded before the client gets its answer, so once the client call returns the server has it). Every socket
has a timeout. Use them as context managers (``serve_webhook()``, ``serve_smtp()``) or as the pytest fixtures
``webhook`` and ``smtp_server``, which a test module makes available by importing them::

    from support.servers import (
        smtp_server_fixture,  # noqa: F401 (pytest fixture ``smtp_server``)
        webhook_fixture,  # noqa: F401 (pytest fixture ``webhook``)
    )
"""

from __future__ import annotations

import contextlib
import email
import json
import socketserver
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

SOCKET_TIMEOUT = 10.0


# -- webhook -----------------------------------------------------------------------------------------------


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class WebhookServer:
    """What the HTTP server received; ``status`` is the status it answers with (set it to make it fail)."""

    url: str
    requests: list[Request] = field(default_factory=list)
    status: int = 200

    def posts(self) -> list[dict[str, Any]]:
        """The JSON bodies of all requests, which must all have been POSTs."""
        assert all(r.method == "POST" for r in self.requests), self.requests
        return [r.json() for r in self.requests]


@contextlib.contextmanager
def _serving(server: socketserver.BaseServer) -> Iterator[None]:
    """Serve ``server`` from a daemon thread; shut it down and close its socket on exit."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=SOCKET_TIMEOUT)


@contextlib.contextmanager
def serve_webhook() -> Iterator[WebhookServer]:
    """An HTTP server on 127.0.0.1 recording every request; its URL ends in ``/hook``."""
    state = WebhookServer(url="")
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        timeout = SOCKET_TIMEOUT

        def _record(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            # Recorded before answering, so the client's return means the server has it.
            with lock:
                state.requests.append(
                    Request(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                )
            self.send_response(state.status)
            self.send_header("Content-Type", "text/plain")
            reply = b"ok" if state.status < 400 else b"boom"
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        do_POST = _record
        do_GET = _record
        do_PUT = _record

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    with _serving(server):
        yield state


# -- smtp --------------------------------------------------------------------------------------------------


@dataclass
class Mail:
    mail_from: str
    rcpt_to: list[str]
    data: bytes

    @property
    def message(self) -> Message:
        return email.message_from_bytes(self.data)

    def text(self) -> str:
        """All text parts, transfer-decoded (the smtp provider sends base64 utf-8 HTML)."""
        out = []
        for part in self.message.walk():
            if part.get_content_maintype() == "text":
                payload = part.get_payload(decode=True)
                assert isinstance(payload, bytes)
                out.append(payload.decode(part.get_content_charset() or "utf-8"))
        return "\n".join(out)


class _SmtpHandler(socketserver.StreamRequestHandler):
    """Just enough SMTP (RFC 5321) to receive mail: no STARTTLS, no AUTH offered."""

    timeout = SOCKET_TIMEOUT
    server: SmtpServer

    def _reply(self, line: str) -> None:
        self.wfile.write(line.encode("ascii") + b"\r\n")
        self.wfile.flush()

    def handle(self) -> None:
        # Client vanished or timed out: the test's own assertions report what is missing.
        with contextlib.suppress(OSError):
            self._session()

    def _session(self) -> None:
        self._reply("220 sluice-test ESMTP")
        mail_from: str | None = None
        rcpt_to: list[str] = []
        while True:
            raw = self.rfile.readline(65536)
            if not raw:
                return  # the provider hook closes without QUIT
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            upper = line.upper()
            if upper.startswith("EHLO"):
                self.wfile.write(b"250-sluice-test\r\n250 8BITMIME\r\n")
            elif upper.startswith("HELO"):
                self._reply("250 sluice-test")
            elif upper.startswith("MAIL FROM:"):
                mail_from, rcpt_to = line[10:].split()[0].strip("<>"), []
                self._reply("250 OK")
            elif upper.startswith("RCPT TO:"):
                if mail_from is None:
                    self._reply("503 need MAIL first")
                    continue
                rcpt_to.append(line[8:].split()[0].strip("<>"))
                self._reply("250 OK")
            elif upper == "DATA":
                if mail_from is None or not rcpt_to:
                    self._reply("503 need RCPT first")
                    continue
                self._reply("354 end with <CRLF>.<CRLF>")
                lines = []
                while (chunk := self.rfile.readline(65536)) not in (b".\r\n", b".\n"):
                    if not chunk:
                        return  # connection lost mid-message: nothing delivered
                    lines.append(chunk[1:] if chunk.startswith(b"..") else chunk)  # undo dot-stuffing
                with self.server.lock:
                    self.server.mails.append(Mail(mail_from, rcpt_to, b"".join(lines)))
                mail_from, rcpt_to = None, []
                self._reply("250 OK queued")
            elif upper in ("RSET", "NOOP"):
                if upper == "RSET":
                    mail_from, rcpt_to = None, []
                self._reply("250 OK")
            elif upper == "QUIT":
                self._reply("221 bye")
                return
            else:
                self._reply("502 command not implemented")


class SmtpServer(socketserver.ThreadingTCPServer):
    """An SMTP server on 127.0.0.1 (ephemeral ``port``) recording every mail it accepts in ``mails``."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _SmtpHandler)
        self.lock = threading.Lock()
        self.mails: list[Mail] = []

    @property
    def port(self) -> int:
        return int(self.server_address[1])


@contextlib.contextmanager
def serve_smtp() -> Iterator[SmtpServer]:
    """A running :class:`SmtpServer`, shut down on exit."""
    server = SmtpServer()
    with _serving(server):
        yield server


# -- pytest fixtures ---------------------------------------------------------------------------------------
# Registered under the names the tests use (``webhook``, ``smtp_server``); the Python names differ so that a
# test module importing them does not shadow them with its test functions' arguments.


@pytest.fixture(name="webhook")
def webhook_fixture() -> Iterator[WebhookServer]:
    with serve_webhook() as server:
        yield server


@pytest.fixture(name="smtp_server")
def smtp_server_fixture() -> Iterator[SmtpServer]:
    with serve_smtp() as server:
        yield server


# -- a Maven repository ------------------------------------------------------------------------------------


@dataclass
class FileServer:
    url: str
    paths: list[str] = field(default_factory=list)  # every GET's path, in order


@contextlib.contextmanager
def serve_directory(root: Any) -> Iterator[FileServer]:
    """A static HTTP server on 127.0.0.1 for the files under ``root`` (a Maven repository's layout), recording
    each request's path; 404 for what is not there."""
    from functools import partial
    from http.server import SimpleHTTPRequestHandler

    state = FileServer(url="")

    class Handler(SimpleHTTPRequestHandler):
        timeout = SOCKET_TIMEOUT

        def do_GET(self) -> None:
            state.paths.append(self.path)
            super().do_GET()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(root)))
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    with _serving(server):
        yield state
