"""Fetching vLLM's pages: one hard deadline per fetch and a cap on decoded bytes.

httpx's timeouts bound each read, not the request: a server dripping one byte at a time
(in its headers or its body) never trips them. So a watchdog shuts the socket down when
the wall-clock deadline passes, whatever httpx is waiting for, and the body loop also
checks the deadline between chunks. Bodies are read raw and inflated here with a bound,
so a gzip bomb costs at most the cap, whatever the server claims.

A page is trusted only when its end is proven, because a page cut at a line boundary
is valid exposition text that reads as whole (a data-parallel page cut between the
engines' `cache_config_info` lines doubled engine 0's KV pool). The proofs: a
`Content-Length` the body matched or the chunked encoding's terminator (httpx raises
`RemoteProtocolError` on a body cut short of either: `connect`), a gzip or deflate
stream's own end, or OpenMetrics' `# EOF` line (an OpenMetrics page must end with one
anyway: the page reader refuses it without). A body read until the connection closed
with none of these is refused (`truncated`). vLLM's uvicorn frames every answer (the
whole page with a `Content-Length`, prometheus_client's filtered page chunked), so only
an HTTP/1.0-style proxy in between meets the refusal.

A vLLM behind a TLS or token-checking proxy is reached with `TargetCredentials`: a CA to
trust, a client certificate, a bearer token (or basic auth: `glassbox probe` reads an
exporter that asks for it). The files are watched, not read once: the token and
password files are read for every request and the certificates are reloaded when one of
their files changes, so rotation (cert-manager, projected ServiceAccount tokens) works
without a restart. No credential ever goes into a message.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import heapq
import itertools
import math
import os
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx
from vllm_glassbox.core.errors import ScrapeError, plain_reason
from vllm_glassbox.core.textformat import ends_with_eof


class _Watchdog:
    """Shuts the fetch's socket down at the deadline, so no read can outlive it."""

    def __init__(self, seconds: float) -> None:
        self.fired = False
        self.done = False  # the fetch ended: nothing left to cut
        self.deadline = time.monotonic() + seconds
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def trace(self, event: str, info: Mapping[str, Any]) -> None:
        """httpx's `trace` extension: learn the socket as soon as it is connected."""
        if event == "connection.connect_tcp.complete":
            with self._lock:
                self._sock = info["return_value"].get_extra_info("socket")
                if self.fired:
                    self._shutdown()

    def fire(self) -> None:
        """Cut the fetch now (at the deadline, or when the exporter stops)."""
        with self._lock:
            self.fired = True
            self._shutdown()

    def _shutdown(self) -> None:
        # shutdown(), not close(): it wakes a recv() blocked in another thread.
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> _Watchdog:
        _DEADLINES.watch(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.done = True


class _Deadlines:
    """One thread fires every watchdog whose deadline passes. A thread started per fetch
    (a `threading.Timer`) cost as much CPU as the rest of a fetch of a small page."""

    def __init__(self) -> None:
        self._wake = threading.Condition()
        self._heap: list[tuple[float, int, _Watchdog]] = []
        self._order = itertools.count()  # ties: never compare watchdogs
        self._thread: threading.Thread | None = None

    def watch(self, watchdog: _Watchdog) -> None:
        with self._wake:
            # Forget the fetches that ended in time now, not only when the thread next
            # wakes: the heap (each entry holding its socket) stays at the fetches in
            # flight, however late the thread runs on a busy machine.
            while self._heap and self._heap[0][2].done:
                heapq.heappop(self._heap)
            earliest = self._heap[0][0] if self._heap else math.inf
            heapq.heappush(self._heap, (watchdog.deadline, next(self._order), watchdog))
            if self._thread is None or not self._thread.is_alive():  # first, or forked
                self._thread = threading.Thread(target=self._run, name="fetch-deadlines")
                self._thread.daemon = True
                self._thread.start()
            if watchdog.deadline < earliest:  # else the thread wakes early enough already
                self._wake.notify()

    def _run(self) -> None:
        with self._wake:
            while True:
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)  # ended in time: forget it
                if not self._heap:
                    self._wake.wait()
                    continue
                deadline, _, watchdog = self._heap[0]
                left = deadline - time.monotonic()
                if left > 0:
                    self._wake.wait(left)
                    continue
                heapq.heappop(self._heap)
                watchdog.fire()


_DEADLINES = _Deadlines()


@dataclass(frozen=True)
class TargetCredentials:
    """How to reach a guarded vLLM: files, read when needed (see the module docstring)."""

    ca_file: str | None = None  # trust this CA for the target's certificate
    cert_file: str | None = None  # our client certificate (with key_file)
    key_file: str | None = None
    bearer_token_file: str | None = None  # `Authorization: Bearer <the file's content>`
    username_file: str | None = None  # basic auth, with password_file
    password_file: str | None = None

    @property
    def tls_files(self) -> tuple[str, ...]:
        return tuple(f for f in (self.ca_file, self.cert_file, self.key_file) if f)


def tls_context(credentials: TargetCredentials) -> ssl.SSLContext | None:
    """The client TLS context the credentials ask for; None for the system default."""
    if not credentials.tls_files:
        return None
    context = ssl.create_default_context(cafile=credentials.ca_file)
    if credentials.cert_file and credentials.key_file:
        context.load_cert_chain(credentials.cert_file, credentials.key_file, password=b"")
    return context


def read_token(path: str) -> str:
    """The bearer token in `path` (surrounding whitespace dropped); ValueError if empty."""
    with open(path, "rb") as f:
        token = f.read(64 * 1024).strip()
    if not token:
        raise ValueError("the file is empty")
    return token.decode("ascii")


def _read_secret(path: str, what: str) -> str:
    try:
        return read_token(path)
    except (OSError, ValueError) as e:  # never the secret itself in the message
        reason = f"cannot read the {what} file {path}: {plain_reason(e)}"
        raise ScrapeError("connect", reason) from None


def _file_signature(paths: tuple[str, ...]) -> tuple[tuple[int, int, int] | None, ...]:
    def one(path: str) -> tuple[int, int, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    return tuple(one(p) for p in paths)


#: The largest page read, after decompression (the exporter's --max-bytes).
DEFAULT_MAX_BYTES = 8 * 1024 * 1024


class Fetcher:
    """GET pages of one server, each within a hard deadline and a byte cap."""

    def __init__(
        self,
        base_url: str,
        timeout_seconds: float,
        max_bytes: int = DEFAULT_MAX_BYTES,
        credentials: TargetCredentials | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_seconds = timeout_seconds
        self.max_bytes = max_bytes
        self.credentials = credentials or TargetCredentials()
        self._signature = _file_signature(self.credentials.tls_files)
        self._client = self._new_client()
        self._in_flight: _Watchdog | None = None  # the fetch abort() cuts
        self._answered_as: str | None = None  # the content type of the latest answer
        self._aborted = False

    def _new_client(self) -> httpx.Client:
        # No redirects, no proxies from the environment. No keep-alive either: a fresh
        # loopback connection per poll is cheap (httpx even spends less CPU per request
        # without its pool), it rules out racing the server's idle timeout (uvicorn drops
        # idle connections after 5 s, the default poll period), and it lets the watchdog
        # see every socket as it is connected.
        context = tls_context(self.credentials)
        return httpx.Client(
            follow_redirects=False,
            trust_env=False,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=0),
            verify=True if context is None else context,
        )

    def _current_client(self) -> httpx.Client:
        """The client, rebuilt when a certificate, key or CA file changed."""
        signature = _file_signature(self.credentials.tls_files)
        if signature != self._signature:
            try:
                client = self._new_client()
            except (OSError, ssl.SSLError) as e:
                # Half-rotated files (a certificate without its new key yet): try again
                # at the next poll, with the old client meanwhile.
                reason = f"cannot load the target TLS files: {type(e).__name__}: {plain_reason(e)}"
                raise ScrapeError("connect", reason) from None
            self._client.close()
            self._client, self._signature = client, signature
        return self._client

    def _auth_headers(self) -> dict[str, str]:
        c = self.credentials
        if c.bearer_token_file is not None:
            return {"Authorization": f"Bearer {_read_secret(c.bearer_token_file, 'bearer token')}"}
        if c.username_file is not None and c.password_file is not None:
            user = _read_secret(c.username_file, "user name")
            password = _read_secret(c.password_file, "password")
            pair = base64.b64encode(f"{user}:{password}".encode()).decode()
            return {"Authorization": f"Basic {pair}"}
        return {}

    def close(self) -> None:
        self._client.close()

    def abort(self) -> None:
        """End the fetch in flight now and refuse new ones (the exporter is stopping)."""
        self._aborted = True
        watchdog = self._in_flight
        if watchdog is not None:
            watchdog.fire()

    def get_page(self, path: str, timeout_seconds: float | None = None) -> Fetched:
        """GET base_url + path as text, with the content type it was answered as. Through
        get_text, so that a Fetcher that answers from elsewhere (a recorded page) only
        overrides that one, and answers without a content type."""
        self._answered_as = None
        text = self.get_text(path, timeout_seconds)
        return Fetched(text, self._answered_as)

    def get_text(self, path: str, timeout_seconds: float | None = None) -> str:
        """GET base_url + path as text within the deadline, or raise ScrapeError."""
        fetched = self._fetch(path, timeout_seconds)
        self._answered_as = fetched.content_type
        return fetched.text

    def _fetch(self, path: str, timeout_seconds: float | None) -> Fetched:
        seconds = self.timeout_seconds if timeout_seconds is None else timeout_seconds
        shown = shown_path(path)
        if seconds <= 0:
            raise ScrapeError("timeout", f"{shown}: no time left in this poll")
        with _Watchdog(seconds) as watchdog:
            deadline = watchdog.deadline
            self._in_flight = watchdog
            try:
                if self._aborted:
                    watchdog.fire()
                return self._get(path, shown, seconds, deadline, watchdog)
            except ScrapeError:
                raise
            except httpx.HTTPError as e:
                if watchdog.fired or isinstance(e, httpx.TimeoutException):
                    raise ScrapeError(
                        "timeout", f"{shown}: no complete answer within {seconds:g}s"
                    ) from None
                # Refused, reset, or closed before the announced body was complete.
                raise ScrapeError(
                    "connect",
                    f"{shown}: {type(e).__name__}: {e}",
                    refused=isinstance(e, httpx.ConnectError),
                ) from None
            finally:
                self._in_flight = None

    def _get(
        self, path: str, shown: str, seconds: float, deadline: float, watchdog: _Watchdog
    ) -> Fetched:
        # The text format asked for, not OpenMetrics (whose `# EOF` would prove a page
        # whole): vLLM's whole /metrics (prometheus-fastapi-instrumentator) answers text
        # whatever is asked, and prometheus_client's OpenMetrics (0.26) writes `vllm:x`
        # samples as `vllm_x`, so every name read here would change. The framing proves
        # the end. vLLM's Rust front end answers OpenMetrics 1.0 whatever is asked: the
        # content type goes with the text, and the page is read by it.
        headers = {"Accept-Encoding": "identity", "Accept": "text/plain", **self._auth_headers()}
        with self._current_client().stream(
            "GET",
            _parsed_url(self.base_url + path),
            headers=headers,
            timeout=httpx.Timeout(seconds),
            extensions={"trace": watchdog.trace},
        ) as response:
            if response.status_code != 200:
                raise ScrapeError("http_status", f"{shown}: HTTP {response.status_code}")
            # httpx checks these framings itself (it raises on a body cut short of them).
            framed = "content-length" in response.headers or (
                "chunked" in response.headers.get("transfer-encoding", "").lower()
            )
            content_type = response.headers.get("content-type")
            declared = response.headers.get("content-length", "")
            encoding = response.headers.get("content-encoding", "identity").lower()
            if encoding == "identity" and declared.isdigit() and int(declared) > self.max_bytes:
                raise ScrapeError(
                    "too_large", f"{shown}: {declared} bytes announced (cap {self.max_bytes})"
                )
            inflater = _inflater(encoding)
            body = bytearray()
            for chunk in response.iter_raw():
                if time.monotonic() > deadline:
                    raise ScrapeError("timeout", f"{shown}: body not complete within {seconds:g}s")
                room = self.max_bytes + 1 - len(body)
                if inflater is None:
                    body += chunk[:room]
                else:
                    try:
                        body += inflater.decompress(chunk, room)
                    except zlib.error as e:
                        raise ScrapeError("decode", f"{shown}: bad {encoding} body: {e}") from None
                    if inflater.unconsumed_tail:
                        body += b"x"  # more was coming: over the cap
                if len(body) > self.max_bytes:
                    raise ScrapeError(
                        "too_large", f"{shown}: body exceeds {self.max_bytes} bytes decoded"
                    )
            if inflater is not None and not inflater.eof:
                raise ScrapeError("decode", f"{shown}: {encoding} body ends early")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ScrapeError(
                "decode", f"{shown}: not UTF-8 ({e.reason} at byte {e.start})"
            ) from None
        # A gzip or deflate stream ends in a trailer of its own (checked above).
        if not framed and inflater is None and not ends_with_eof(text):
            raise ScrapeError(
                "truncated",
                f"{shown}: read until the connection closed, with no Content-Length, "
                "chunked encoding or `# EOF` to prove the page whole",
            )
        return Fetched(text, content_type)


@dataclass(frozen=True)
class Fetched:
    """A page as it was answered: its text and its `Content-Type` (None without one)."""

    text: str
    content_type: str | None = None


@functools.lru_cache(maxsize=16)
def _parsed_url(url: str) -> httpx.URL:
    """The URL, parsed once: httpx checks each character of a URL given as a string, and
    the filtered page's (~1 KB of `name[]=` parameters) cost a tenth of a poll's CPU."""
    return httpx.URL(url)


def shown_path(path: str) -> str:
    """A path as messages show it: a long query (`name[]=…` for each sample read) is elided."""
    head, mark, query = path.partition("?")
    return path if len(path) <= 80 else f"{head}{mark}… ({query.count('&') + 1} parameters)"


def fetch_once(
    base_url: str,
    path: str,
    timeout_seconds: float,
    credentials: TargetCredentials | None = None,
) -> str:
    """One GET of base_url + path with a Fetcher of its own; raises ScrapeError."""
    fetcher = Fetcher(base_url, timeout_seconds, credentials=credentials)
    try:
        return fetcher.get_text(path)
    finally:
        fetcher.close()


def _inflater(encoding: str) -> zlib._Decompress | None:
    if encoding in ("identity", ""):
        return None
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return zlib.decompressobj()
    raise ScrapeError("decode", f"unsupported Content-Encoding {encoding!r}")
