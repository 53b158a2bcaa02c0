"""A loopback HTTP server that misbehaves on purpose, switchable while it runs.

`Misbehaving` answers every request with its current `Behaviour`; the failure tests flip
it from a healthy fake vLLM to a failure and back while a real exporter polls it:

    with Misbehaving(FakeVllm()) as target:
        target.behave(drip(target.fake, seconds_per_byte=0.5))
        ...
        target.behave(healthy(target.fake))

`refuse()` closes the listening socket (connections are refused) and `listen()` opens it
again on the same port. With `tls` (a server SSLContext) it speaks HTTPS, as a TLS proxy
in front of vLLM would; `guarded` answers 401 unless the request carries a bearer token.
Large payloads are generated chunk by chunk, so the server itself
never holds them in memory (the tests measure the exporter's memory with tracemalloc,
which sees every thread of the process).
"""

from __future__ import annotations

import contextlib
import gzip
import random
import socket
import ssl
import struct
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

Behaviour = Callable[["_Handler"], None]

CHUNK = 64 * 1024


@dataclass(frozen=True)
class Step:
    """How much each counter of one engine grows between two GETs of /metrics."""

    generation_tokens: int = 40
    prompt_tokens: int = 200
    ttft_count: int = 2
    ttft_sum: float = 0.1
    itl_count: int = 38
    itl_sum: float = 0.38
    engine_steps: int = 20
    preemptions: int = 0


@dataclass
class FakeVllm:
    """A plausible vLLM page whose counters advance one `Step` per GET of /metrics.

    Steady decoding: every windowed ratio is the same whatever the window holds, so a
    test knows each derived value by hand. `restart()` is a new vLLM process (counters
    from zero, a new `process_start_time_seconds`).
    """

    engines: tuple[str, ...] = ("0",)
    model_name: str = "fake"
    step: Step = field(default_factory=Step)
    blocks: int = 32
    block_size: int = 128
    kv_usage: float = 0.25
    show_process_start: bool = True
    polls: int = 0
    process_start: float = 1_700_000_000.0
    version: str = "0.32.0"
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def restart(self, polls_before_first_page: int = 0) -> None:
        with self._lock:
            self.polls = polls_before_first_page
            self.process_start += 3600.0

    def page(self) -> str:
        """The next /metrics page (advances the counters by one step)."""
        with self._lock:
            self.polls += 1
            n = self.polls
        return render_page(self, n)


def render_page(fake: FakeVllm, n: int) -> str:
    s = fake.step
    out: list[str] = []

    def family(name: str, kind: str, help_text: str) -> None:
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")

    def per_engine(name: str, value: float, extra: str = "") -> None:
        for engine in fake.engines:
            out.append(f'{name}{{engine="{engine}",{extra}model_name="{fake.model_name}"}} ')
            out.append(f"{float(value)!r}\n")

    def histogram(name: str, help_text: str, count: int, total: float) -> None:
        family(name, "histogram", help_text)
        for le in ("0.01", "0.1", "1.0", "+Inf"):
            per_engine(name + "_bucket", count, f'le="{le}",')
        per_engine(name + "_count", count)
        per_engine(name + "_sum", total)
        family(name + "_created", "gauge", help_text)
        per_engine(name + "_created", fake.process_start + 5)

    def counter(name: str, help_text: str, value: float) -> None:
        family(name, "counter", help_text)
        per_engine(name + "_total", value)
        per_engine(name + "_created", fake.process_start + 5)

    if fake.show_process_start:
        family("process_start_time_seconds", "gauge", "Start time of the process.")
        out.append(f"process_start_time_seconds {fake.process_start!r}\n")
    family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.")
    per_engine("vllm:num_requests_running", 2)
    family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.")
    per_engine("vllm:num_requests_waiting", 0)
    family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.")
    per_engine("vllm:kv_cache_usage_perc", fake.kv_usage)
    counter("vllm:num_preemptions", "Cumulative number of preemption.", n * s.preemptions)
    counter("vllm:prompt_tokens", "Number of prefill tokens processed.", n * s.prompt_tokens)
    counter("vllm:generation_tokens", "Number of generation tokens.", n * s.generation_tokens)
    histogram(
        "vllm:iteration_tokens_total",
        "Histogram of number of tokens per engine_step.",
        n * s.engine_steps,
        float(n * (s.generation_tokens + s.prompt_tokens)),
    )
    histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        n * s.ttft_count,
        n * s.ttft_sum,
    )
    histogram(
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        n * s.itl_count,
        n * s.itl_sum,
    )
    # The requests that finished: as many as first tokens, each with its prompt and output.
    histogram(
        "vllm:request_prompt_tokens",
        "Number of prefill tokens processed.",
        n * s.ttft_count,
        float(n * s.prompt_tokens),
    )
    histogram(
        "vllm:request_generation_tokens",
        "Number of generation tokens processed.",
        n * s.ttft_count,
        float(n * s.generation_tokens),
    )
    family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
    for engine in fake.engines:
        out.append(
            f'vllm:cache_config_info{{block_size="{fake.block_size}",cache_dtype="auto",'
            f'engine="{engine}",num_gpu_blocks="{fake.blocks * len(fake.engines)}"}} 1.0\n'
        )
    return "".join(out)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_GET(self) -> None:
        with contextlib.suppress(OSError):  # the client gave up: fine, that is the point
            self.server.owner.behaviour(self)
            self.wfile.flush()
        self.close_connection = True

    def send_head(self, length: int | None, extra: Iterable[tuple[str, str]] = ()) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        if length is not None:
            self.send_header("Content-Length", str(length))
        for name, value in extra:
            self.send_header(name, value)
        self.send_header("Connection", "close")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True
    owner: Misbehaving


class Misbehaving:
    """A threaded loopback server answering with a switchable behaviour."""

    def __init__(self, fake: FakeVllm | None = None, tls: ssl.SSLContext | None = None) -> None:
        self.fake = fake or FakeVllm()
        self.tls = tls
        self.behaviour: Behaviour = healthy(self.fake)
        self.stopping = threading.Event()  # wakes behaviours that stall
        self.port = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def behave(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour

    def listen(self) -> None:
        server = _Server(("127.0.0.1", self.port), _Handler)
        server.owner = self
        if self.tls is not None:  # the handshake runs in accept(); a failed one is dropped
            server.socket = self.tls.wrap_socket(server.socket, server_side=True)
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()

    def refuse(self) -> None:
        """Close the listening socket: new connections are refused."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Misbehaving:
        self.listen()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stopping.set()
        self.refuse()


# --- behaviours -------------------------------------------------------------------------


def healthy(fake: FakeVllm) -> Behaviour:
    def run(h: _Handler) -> None:
        if h.path.startswith("/version"):
            body = f'{{"version": "{fake.version}"}}'.encode()
        else:
            body = fake.page().encode()
        h.send_head(len(body))
        h.wfile.write(body)

    return run


def late(fake: FakeVllm, seconds: float) -> Behaviour:
    """A busy vLLM: the healthy answer, after `seconds`."""
    answer = healthy(fake)

    def run(h: _Handler) -> None:
        if not h.server.owner.stopping.wait(seconds):
            answer(h)

    return run


def guarded(behaviour: Behaviour, token: Callable[[], str]) -> Behaviour:
    """`behaviour` for requests with `Authorization: Bearer <token()>`, else 401."""

    def run(h: _Handler) -> None:
        if h.headers.get("Authorization") != f"Bearer {token()}":
            status(401)(h)
        else:
            behaviour(h)

    return run


def status(code: int) -> Behaviour:
    def run(h: _Handler) -> None:
        body = f"HTTP {code}\n".encode()
        h.send_response(code)
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(body)

    return run


def body(data: bytes | str) -> Behaviour:
    """Send `data`, whatever it is, with an honest Content-Length."""
    raw = data.encode() if isinstance(data, str) else data

    def run(h: _Handler) -> None:
        h.send_head(len(raw))
        h.wfile.write(raw)

    return run


def garbage(size: int = 64 * 1024, seed: int = 7) -> Behaviour:
    """Random bytes: not UTF-8, not text."""
    return body(random.Random(seed).randbytes(size))


def truncated(fake: FakeVllm, honest: bool) -> Behaviour:
    """A page cut in the middle of a line. Honest: Content-Length says the cut length.
    Dishonest: it announces the whole page, sends part of it and closes."""

    def run(h: _Handler) -> None:
        page = fake.page().encode()
        cut = page[: int(len(page) * 0.6)]
        if cut.endswith(b"\n"):
            cut = cut[:-1]
        h.send_head(len(cut) if honest else len(page))
        h.wfile.write(cut)

    return run


def cut_at_a_line(fake: FakeVllm) -> Behaviour:
    """A page cut at a line boundary (valid text, wrong numbers), read until the
    connection closes: no Content-Length and no chunked encoding say where it ends."""

    def run(h: _Handler) -> None:
        page = fake.page().encode()
        cut = page[: page.rindex(b"\n", 0, int(len(page) * 0.6)) + 1]
        h.send_head(None)
        h.wfile.write(cut)

    return run


def drip(fake: FakeVllm, seconds_per_byte: float = 0.5) -> Behaviour:
    """Headers at once, then the body one byte at a time."""

    def run(h: _Handler) -> None:
        page = fake.page().encode()
        h.send_head(len(page))
        h.wfile.flush()
        for i in range(len(page)):
            h.wfile.write(page[i : i + 1])
            h.wfile.flush()
            if h.server.owner.stopping.wait(seconds_per_byte):
                return

    return run


def drip_headers(seconds_per_byte: float = 0.3) -> Behaviour:
    """Even the status line arrives one byte at a time."""

    def run(h: _Handler) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\n"
        for i in range(len(head)):
            h.wfile.write(head[i : i + 1])
            h.wfile.flush()
            if h.server.owner.stopping.wait(seconds_per_byte):
                return

    return run


def stall_after_headers(seconds: float = 600.0) -> Behaviour:
    """Announce a body, then send nothing."""

    def run(h: _Handler) -> None:
        h.send_head(50_000)
        h.wfile.flush()
        h.server.owner.stopping.wait(seconds)

    return run


def endless_lines(line: bytes) -> Iterator[bytes]:
    block = line * (CHUNK // len(line) + 1)
    while True:
        yield block


def stream(chunks: Callable[[], Iterable[bytes]], total: int, announce: bool) -> Behaviour:
    """Send `total` bytes from `chunks()`, with or without Content-Length (close-delimited)."""

    def run(h: _Handler) -> None:
        h.send_head(total if announce else None)
        sent = 0
        for chunk in chunks():
            chunk = chunk[: total - sent]
            h.wfile.write(chunk)
            sent += len(chunk)
            if sent >= total:
                break

    return run


def huge_page(total: int = 20_000_000, announce: bool = True) -> Behaviour:
    """A page of `total` bytes of well-formed exposition lines."""
    line = b'vllm:some_unused_series_total{engine="0",model_name="fake"} 1.0\n'
    return stream(lambda: endless_lines(line), total, announce)


@cache
def _gzip_bomb(inflated: int) -> bytes:
    """About `inflated` bytes of comment lines as one gzip member (about 1000:1).

    After a full flush deflate forgets its history, so every 1 MiB block compresses to
    the same bytes: the bomb is built by repetition in a fraction of a second.
    """
    block = b"# " + b"x" * (1024 * 1024 - 3) + b"\n"
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    compressed = deflate.compress(block) + deflate.flush(zlib.Z_FULL_FLUSH)
    count = max(inflated // len(block), 1)
    crc = 0
    for _ in range(count):
        crc = zlib.crc32(block, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    trailer = struct.pack("<II", crc, (count * len(block)) & 0xFFFFFFFF)
    return header + compressed * count + deflate.flush(zlib.Z_FINISH) + trailer


def gzip_bomb(inflated: int = 256 * 1024 * 1024) -> Behaviour:
    """Small on the wire, huge inflated; sent gzip although the client asked for identity."""
    data = _gzip_bomb(inflated)

    def run(h: _Handler) -> None:
        h.send_head(len(data), [("Content-Encoding", "gzip")])
        h.wfile.write(data)

    return run


def many_series(count: int = 100_000) -> Behaviour:
    """`count` series of one family the exporter reads (vllm:num_requests_running).

    Built here, once: generating 100k lines per request would make the server the slow
    side of the test.
    """
    lines = [b'vllm:num_requests_running{pid="%d"} 1\n' % i for i in range(count)]
    page = b"# TYPE vllm:num_requests_running gauge\n" + b"".join(lines)
    return body(page)


def reset() -> Behaviour:
    """Read the request, then abort the connection (TCP RST instead of an answer)."""

    def run(h: _Handler) -> None:
        h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        h.connection.close()

    return run


def page_with(fake: FakeVllm, edit: Callable[[str], str]) -> Behaviour:
    """The fake's next page, edited (NaN values, duplicated lines, ...)."""

    def run(h: _Handler) -> None:
        raw = edit(fake.page()).encode()
        h.send_head(len(raw))
        h.wfile.write(raw)

    return run


def gzip_page(fake: FakeVllm) -> Behaviour:
    """A healthy page, gzip-encoded (a proxy in between that compresses anyway)."""

    def run(h: _Handler) -> None:
        raw = gzip.compress(fake.page().encode())
        h.send_head(len(raw), [("Content-Encoding", "gzip")])
        h.wfile.write(raw)

    return run
