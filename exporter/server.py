"""The exporter's HTTP server: small, bounded, and hard to hold down.

One asyncio loop in one thread serves every connection; a connection costs a few KiB,
not a thread. What an abusive client can take is bounded:

- a request head (request line and headers) must be complete within `head_seconds` of
  its first byte, and fit in `head_bytes` (slow-loris, endless headers: 408, 431);
- an idle keep-alive connection waits at most `idle_seconds` for its next request;
- a request may not have a body (`/metrics` takes GET): a `Content-Length` or
  `Transfer-Encoding` is answered 413 and the connection closed, without reading it;
- a malformed request line or header is answered 400 and the connection closed;
- at most `max_connections` connections are open. One more evicts the connection that
  has waited longest for a request (a slow-loris, or an idle keep-alive one), so a
  client holding connections open cannot lock Prometheus out;
- a response the client does not read is dropped after `write_seconds`;
- a TLS handshake must finish within `head_seconds`.

TLS and basic auth come from a `WebConfigSource` (`webconfig.py`): each new connection
uses the configuration in force when it arrives, so certificates can be rotated. A
bcrypt check that is not cached runs in a worker thread, so it never stalls the loop.
`/healthz` needs no credentials (it tells nothing but "ok"), so a probe works as is.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus

from vllm_glassbox.exporter.webconfig import BasicAuth, WebConfigSource

log = logging.getLogger("glassbox.exporter")


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()  # more header fields (Content-Encoding…)


Route = Callable[[str, Mapping[str, str]], Answer]
"""A request's path and header fields (names in lower case) -> its answer."""


@dataclass(frozen=True)
class ServerLimits:
    head_seconds: float = 10.0
    idle_seconds: float = 60.0
    write_seconds: float = 10.0
    head_bytes: int = 16 * 1024
    max_headers: int = 100
    max_connections: int = 512


class _Refused(Exception):
    """The request is answered with this status and the connection closed."""

    def __init__(self, status: HTTPStatus, note: str) -> None:
        super().__init__(note)
        self.status = status


@dataclass(eq=False)  # hashed by identity: a key of the open connections
class _Connection:
    writer: asyncio.StreamWriter
    waiting: bool = True  # for a request (evictable), not being answered


@dataclass(frozen=True)
class _Request:
    method: str
    path: str
    version: str
    headers: dict[str, str]


class MetricsServer:
    """`serve_forever()` in one thread, `shutdown()` from another (as socketserver's)."""

    def __init__(
        self,
        host: str,
        port: int,
        route: Route,
        web: WebConfigSource | None = None,
        limits: ServerLimits = ServerLimits(),
        server_name: str = "glassbox",
    ) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # Bound here, so a busy port is an OSError for the caller, before any thread.
        # `[::]` takes IPv4 too, as a plain IPv6 socket does on Linux by default.
        dualstack = host == "::" and socket.has_dualstack_ipv6()
        self.socket = socket.create_server(
            (host, port), family=family, backlog=1024, dualstack_ipv6=dualstack
        )
        self.server_address: tuple[str, int] = self.socket.getsockname()[:2]
        self.route = route
        self.web = web
        self.limits = limits
        self.server_name = server_name
        self._connections: dict[_Connection, None] = {}  # insertion order: oldest first
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._finished = threading.Event()
        self._shutdown_asked = False

    # -- life cycle ------------------------------------------------------------------------

    def serve_forever(self) -> None:
        try:
            asyncio.run(self._serve())
        finally:
            self._finished.set()

    def shutdown(self) -> None:
        """Stop serving and wait until `serve_forever` has returned."""
        self._shutdown_asked = True
        if self._started.is_set() and self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                self._loop.call_soon_threadsafe(self._stop.set)
            self._finished.wait()

    def server_close(self) -> None:
        self.socket.close()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.set_exception_handler(_quiet)
        self._stop = asyncio.Event()
        server = await asyncio.start_server(
            self._connection, sock=self.socket, limit=self.limits.head_bytes
        )
        self._started.set()
        if self._shutdown_asked:
            self._stop.set()
        async with server:
            await self._stop.wait()
            server.close()
            for connection in list(self._connections):
                connection.writer.transport.abort()

    # -- one connection --------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(writer)
        if len(self._connections) >= self.limits.max_connections:
            waiting = next((c for c in self._connections if c.waiting), None)
            if waiting is None:  # every connection is being answered: this one waits its turn
                writer.transport.abort()
                return
            self._evict(waiting)
        self._connections[connection] = None
        try:
            await self._converse(connection, reader, writer)
        except (OSError, EOFError, TimeoutError, asyncio.IncompleteReadError):
            pass  # the client went away, or was too slow: nothing to answer
        except Exception:  # a bug must not take the server down; log it, drop the client
            log.exception("unexpected error while serving a request")
        finally:
            self._connections.pop(connection, None)
            await self._close(writer)

    async def _close(self, writer: asyncio.StreamWriter) -> None:
        """Close after the answer is out (within `write_seconds`), else drop it."""
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), self.limits.write_seconds)
        except (OSError, TimeoutError):
            writer.transport.abort()

    def _evict(self, connection: _Connection) -> None:
        self._connections.pop(connection, None)
        connection.writer.transport.abort()

    async def _converse(
        self, connection: _Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        auth: BasicAuth | None = None
        if self.web is not None:
            context, auth = self.web.current()
            if context is not None:
                await writer.start_tls(context, ssl_handshake_timeout=self.limits.head_seconds)
        first = True
        while True:
            connection.waiting = True
            try:
                request = await self._read_request(reader, first)
            except _Refused as refused:
                connection.waiting = False
                await self._answer(writer, None, refused.status, str(refused).encode(), False)
                await self._linger(reader, writer)
                return
            if request is None:
                return
            connection.waiting = False
            keep_alive = await self._handle(reader, writer, request, auth)
            if not keep_alive:
                return
            first = False

    async def _read_request(self, reader: asyncio.StreamReader, first: bool) -> _Request | None:
        """The next request head, or None when the client closed or stayed idle."""
        limits = self.limits
        try:
            start = await asyncio.wait_for(
                reader.read(1), limits.head_seconds if first else limits.idle_seconds
            )
        except TimeoutError:
            if first:
                raise _Refused(HTTPStatus.REQUEST_TIMEOUT, "no request in time\n") from None
            return None
        if not start:
            return None
        try:
            rest = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), limits.head_seconds)
        except TimeoutError:
            raise _Refused(
                HTTPStatus.REQUEST_TIMEOUT, "request head not complete in time\n"
            ) from None
        except asyncio.LimitOverrunError:
            raise _Refused(
                HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large\n"
            ) from None
        return parse_head(start + rest, limits.max_headers)

    async def _linger(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Before closing on a client that may still be sending: stop writing and discard
        a little of what it sends, briefly, so it can read the answer before the close
        (closing with unread input resets the connection, and may lose the answer)."""
        with contextlib.suppress(OSError, TimeoutError, RuntimeError, NotImplementedError):
            if writer.can_write_eof():
                writer.write_eof()
            budget = 1024 * 1024
            async with asyncio.timeout(1.0):
                while budget > 0 and (chunk := await reader.read(64 * 1024)):
                    budget -= len(chunk)

    async def _handle(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        request: _Request,
        auth: BasicAuth | None,
    ) -> bool:
        """Answer one request; whether the connection may serve another."""
        keep_alive = request.version == "HTTP/1.1" and (
            request.headers.get("connection", "").lower() != "close"
        )
        if (
            "transfer-encoding" in request.headers
            or request.headers.get("content-length", "0") != "0"
        ):
            # Never read a body: /metrics takes GET. Closing discards whatever was sent.
            status, body = HTTPStatus.REQUEST_ENTITY_TOO_LARGE, b"request bodies are not accepted\n"
            await self._answer(writer, request, status, body, False)
            await self._linger(reader, writer)
            return False
        if request.method not in ("GET", "HEAD"):
            status, body = HTTPStatus.METHOD_NOT_ALLOWED, b"GET or HEAD only\n"
            await self._answer(writer, request, status, body, keep_alive, [("Allow", "GET, HEAD")])
            return keep_alive
        credentials = request.headers.get("authorization", "")
        if (
            auth is not None
            and auth.required
            and request.path != "/healthz"
            and not await _authorized(auth, credentials)
        ):
            challenge = [("WWW-Authenticate", 'Basic realm="glassbox", charset="UTF-8"')]
            status, body = HTTPStatus.UNAUTHORIZED, b"unauthorized\n"
            await self._answer(writer, request, status, body, keep_alive, challenge)
            return keep_alive
        answer = self.route(request.path, request.headers)
        await self._answer(
            writer,
            request,
            HTTPStatus(answer.status),
            answer.body,
            keep_alive,
            list(answer.headers),
            answer.content_type,
        )
        return keep_alive

    async def _answer(
        self,
        writer: asyncio.StreamWriter,
        request: _Request | None,
        status: HTTPStatus,
        body: bytes,
        keep_alive: bool,
        headers: list[tuple[str, str]] | None = None,
        content_type: str = "text/plain; charset=utf-8",
    ) -> None:
        lines = [
            f"HTTP/1.1 {status.value} {status.phrase}",
            f"Server: {self.server_name}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
            *(f"{name}: {value}" for name, value in headers or []),
        ]
        if not keep_alive:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        writer.write(head if request is not None and request.method == "HEAD" else head + body)
        await asyncio.wait_for(writer.drain(), self.limits.write_seconds)
        if request is not None:
            log.debug("http %s %s %s", request.method, request.path, status.value)


def parse_head(head: bytes, max_headers: int = 100) -> _Request:
    """A request head (through its blank line) -> _Request; _Refused(400) if malformed."""
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        raise _Refused(HTTPStatus.BAD_REQUEST, "request head is not ASCII\n") from None
    request_line, *header_lines = text[: -len("\r\n\r\n")].split("\r\n")
    parts = request_line.split(" ")
    if (
        len(parts) != 3
        or not parts[0].isalpha()
        or not parts[0].isupper()
        or parts[2] not in ("HTTP/1.0", "HTTP/1.1")
    ):
        raise _Refused(HTTPStatus.BAD_REQUEST, "malformed request line\n")
    method, target, version = parts
    if target.startswith(("http://", "https://")):  # absolute form: keep the path
        target = "/" + target.split("/", 3)[3] if target.count("/") >= 3 else "/"
    if not target.startswith("/"):
        raise _Refused(HTTPStatus.BAD_REQUEST, "malformed request target\n")
    if len(header_lines) > max_headers:
        raise _Refused(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "too many header fields\n")
    headers: dict[str, str] = {}
    for line in header_lines:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip() or " " in name:
            raise _Refused(HTTPStatus.BAD_REQUEST, "malformed header field\n")
        key = name.lower()
        if key in headers and key in ("content-length", "authorization", "host"):
            raise _Refused(HTTPStatus.BAD_REQUEST, f"{name} given twice\n")
        headers[key] = value.strip()
    return _Request(method, target.split("?", 1)[0], version, headers)


async def _authorized(auth: BasicAuth, header: str) -> bool:
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        user_text, colon, password_text = base64.b64decode(
            encoded.strip(), validate=True
        ).partition(b":")
        user = user_text.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return False
    if not colon:
        return False
    if auth.cached(user, password_text):
        return True
    # bcrypt takes a tenth of a second or more: off the loop.
    return await asyncio.get_running_loop().run_in_executor(None, auth.check, user, password_text)


def _quiet(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
    """asyncio's complaints about clients that vanish mid-handshake belong at debug."""
    error = context.get("exception")
    log.debug(
        "http: %s",
        context.get("message"),
        exc_info=error if isinstance(error, BaseException) else None,
    )
