"""The exporter's HTTP server under abuse: the real `glassbox exporter`, attacked over
loopback, keeps answering Prometheus' scrape, answers the attacker with a 4xx or drops
it, and its memory stays bounded (its peak resident size, VmHWM, read from /proc).

The figures (scrape latency during each attack, memory) come from
benchmarks/bench_abuse.py; these tests assert behaviour only, and wait for conditions.
"""

from __future__ import annotations

import contextlib
import re
import resource
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.k8s_double import wait_until
from tests.misbehaving import FakeVllm, Misbehaving

pytestmark = pytest.mark.slow  # starts servers or processes and waits for them

# Generous: the exporter idles at about 40 MiB; what is asserted is "bounded", not a figure.
MEMORY_CEILING_KIB = 160 * 1024
HEAD = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"


def memory_kib(pid: int, field: str) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB", status, flags=re.M)
    assert match, status
    return int(match.group(1))


class Exporter:
    def __init__(self, target: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vllm_glassbox", "exporter", "--listen", "127.0.0.1:0",
             "--target", target, "--interval", "1s"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if m := re.search(r"serving on http://127\.0\.0\.1:(\d+)/metrics", line):
                self.port = int(m.group(1))
                break
        else:
            raise AssertionError("the exporter did not start")
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()  # keep it drained

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def scrape(self) -> httpx.Response:
        r = httpx.get(self.url + "/metrics", timeout=30)
        assert r.status_code == 200 and "glassbox_target_up 1.0" in r.text
        return r

    def peak_memory_kib(self) -> int:
        return memory_kib(self.proc.pid, "VmHWM")

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=30)

    def ask(self, raw: bytes) -> bytes:
        """Send `raw`, read until the server closes or answers."""
        with self.connect() as s:
            s.sendall(raw)
            return read_answer(s)


def read_answer(s: socket.socket) -> bytes:
    data = b""
    with contextlib.suppress(OSError):
        while b"\r\n\r\n" not in data and (chunk := s.recv(65536)):
            data += chunk
    return data


def answered(s: socket.socket) -> bytes | None:
    """What the server sent before closing, or None while it has said nothing."""
    s.setblocking(False)
    try:
        first = s.recv(65536)
    except BlockingIOError:
        return None
    except OSError:
        return b""
    finally:
        s.settimeout(30)
    return first if b"\r\n\r\n" in first or not first else first + read_answer(s)


@pytest.fixture(scope="module")
def exporter() -> Iterator[Exporter]:
    with Misbehaving(FakeVllm()) as target:
        e = Exporter(target.url)
        try:
            wait_until(lambda: "glassbox_target_up 1.0" in httpx.get(e.url + "/metrics").text)
            yield e
        finally:
            e.proc.terminate()
            e.proc.wait(timeout=30)


@pytest.fixture(scope="module", autouse=True)
def enough_file_descriptors() -> None:
    """This process holds the attackers' sockets: a thousand and more."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def test_slow_loris_clients_are_cut_off_and_prometheus_is_still_served(
    exporter: Exporter,
) -> None:
    lorises = [exporter.connect() for _ in range(100)]
    stop = threading.Event()
    answers: dict[int, bytes] = {}

    def trickle() -> None:  # one more header byte per connection per second, forever
        while not stop.wait(1.0):
            for i, s in enumerate(lorises):
                if i not in answers:
                    with contextlib.suppress(OSError):
                        s.sendall(b"X")

    for s in lorises:
        s.sendall(HEAD)
    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    try:
        for _ in range(5):
            exporter.scrape()  # served while every loris is mid-head

        def all_cut_off() -> bool:
            for i, s in enumerate(lorises):
                if i not in answers and (answer := answered(s)) is not None:
                    answers[i] = answer
            return len(answers) == len(lorises)

        wait_until(all_cut_off, timeout=120)  # the head deadline is 10 s of wall clock
    finally:
        stop.set()
        trickler.join()
        for s in lorises:
            s.close()
    assert all(a.startswith(b"HTTP/1.1 408 Request Timeout") for a in answers.values())
    exporter.scrape()
    assert exporter.peak_memory_kib() < MEMORY_CEILING_KIB


def test_a_thousand_connections_held_open_do_not_lock_prometheus_out(exporter: Exporter) -> None:
    held = [exporter.connect() for _ in range(1000)]
    try:
        for s in held[-100:]:
            s.sendall(HEAD)  # some mid-request, most silent
        for _ in range(10):
            exporter.scrape()  # each one evicts a held connection if the cap is reached

        def closed_by_server(s: socket.socket) -> bool:
            s.setblocking(False)
            try:
                return s.recv(1) == b""
            except BlockingIOError:
                return False
            except OSError:
                return True

        # At most 512 open: the connections beyond were evicted, the longest-waiting first.
        wait_until(lambda: sum(closed_by_server(s) for s in held) >= 1000 - 512, timeout=60)
        assert not any(closed_by_server(s) for s in held[-50:])  # the newest are kept
    finally:
        for s in held:
            s.close()
    exporter.scrape()
    assert exporter.peak_memory_kib() < MEMORY_CEILING_KIB


def test_a_100_mb_request_body_is_refused_without_being_read(exporter: Exporter) -> None:
    size = 100 * 1024 * 1024
    chunk = b"x" * (1024 * 1024)
    with exporter.connect() as s:
        s.sendall(b"POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  b"Content-Length: %d\r\n\r\n" % size + chunk)  # fmt: skip
        answer = read_answer(s)
        assert answer.startswith(b"HTTP/1.1 413 Request Entity Too Large")
        assert b"Connection: close" in answer
        sent = len(chunk)
        with pytest.raises(OSError):  # the server closed: the rest is never taken in
            while sent < size:
                s.sendall(chunk)
                sent += len(chunk)
    assert sent < size
    chunked = exporter.ask(HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
    assert chunked.startswith(b"HTTP/1.1 413")
    exporter.scrape()
    assert exporter.peak_memory_kib() < MEMORY_CEILING_KIB


MALFORMED: list[tuple[str, bytes, bytes]] = [
    ("not HTTP", b"GARBAGE\r\n\r\n", b"400"),
    ("HTTP/0.9", b"GET /metrics\r\n\r\n", b"400"),
    ("HTTP/2 in text", b"GET /metrics HTTP/2.0\r\n\r\n", b"400"),
    ("lowercase method", b"get /metrics HTTP/1.1\r\n\r\n", b"400"),
    ("relative target", b"GET metrics HTTP/1.1\r\n\r\n", b"400"),
    ("extra spaces", b"GET  /metrics HTTP/1.1\r\n\r\n", b"400"),
    ("header without colon", HEAD + b"no colon here\r\n\r\n", b"400"),
    ("space before colon", HEAD + b"Host : x\r\n\r\n", b"400"),
    ("two Content-Lengths", HEAD + b"Content-Length: 0\r\nContent-Length: 5\r\n\r\n", b"400"),
    ("not ASCII", b"GET /\xff\xfe HTTP/1.1\r\n\r\n", b"400"),
    ("a huge header", HEAD + b"X-Big: " + b"a" * 20_000 + b"\r\n\r\n", b"431"),
    ("too many headers", HEAD + b"X: y\r\n" * 200 + b"\r\n", b"431"),
    ("a method it does not take", b"DELETE /metrics HTTP/1.1\r\n\r\n", b"405"),
    ("an unknown path", b"GET /../../etc/passwd HTTP/1.1\r\n\r\n", b"404"),
]


@pytest.mark.parametrize(("raw", "status"), [m[1:] for m in MALFORMED],
                         ids=[m[0] for m in MALFORMED])  # fmt: skip
def test_a_malformed_request_is_answered_4xx_and_the_server_carries_on(
    exporter: Exporter, raw: bytes, status: bytes
) -> None:
    answer = exporter.ask(raw)
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]
    exporter.scrape()


def test_keep_alive_serves_several_scrapes_on_one_connection(exporter: Exporter) -> None:
    with httpx.Client() as client:
        for _ in range(3):
            assert client.get(exporter.url + "/metrics").status_code == 200
        head = client.head(exporter.url + "/metrics")
        assert head.content == b"" and int(head.headers["Content-Length"]) > 1000
        assert client.get(exporter.url + "/healthz").text == "ok\n"  # same connection
