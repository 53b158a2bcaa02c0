"""The exporter's endpoint under abuse, and what basic auth's timing tells an attacker.

    flock /work/heavy.lock .venv/bin/python benchmarks/bench_abuse.py [--seconds 20]

1. Basic auth: the time of a refused request for an unknown user and for a known user
   with a wrong password (bcrypt cost 10), interleaved, in process (`BasicAuth.check`)
   and over HTTP (the real server, one fresh connection per request). The difference of
   the medians is what an attacker could measure to learn which users exist.
2. Abuse: the real `glassbox exporter` (its own process) polling a real 1-engine page;
   for each attack, run from this process for S seconds, a scraper opens a fresh
   connection per scrape, back to back (the worst case for a connection cap) and the
   scrape's latency is recorded, with the exporter's peak resident memory (VmHWM):
     - none (the baseline);
     - slow-loris: 500 connections sending one more header byte each second;
     - 1,000 connections opened and held silent;
     - 100 MB bodies: a POST announcing 100 MB, sending until the server closes, again;
     - malformed requests: garbage request lines, back to back.

Numbers go to benchmarks/README.md by hand; this script is not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import re
import resource
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.queues import SimpleQueue
from pathlib import Path

import bcrypt
import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_poll import ONE_ENGINE, _serve  # noqa: E402
from bench_scrape_load import memory_kib, percentile, start_exporter  # noqa: E402
from vllm_glassbox.exporter.service import ExporterConfig, Poller, make_server  # noqa: E402
from vllm_glassbox.exporter.webconfig import BasicAuth, WebConfigSource  # noqa: E402

from tests.fixtures import page  # noqa: E402

HEAD = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"


def auth_timing(rounds: int) -> None:
    password = b"the real password"
    stored = bcrypt.hashpw(password, bcrypt.gensalt(rounds=10))
    auth = BasicAuth({"prometheus": stored})
    unknown: list[float] = []
    wrong: list[float] = []
    for i in range(rounds):
        for user, into in (("mallory", unknown), ("prometheus", wrong)):
            started = time.perf_counter()
            assert not auth.check(user, b"guess %d" % i)
            into.append(time.perf_counter() - started)
    _report("in process (BasicAuth.check)", unknown, wrong)

    with tempfile.TemporaryDirectory() as tmp:
        web = Path(tmp) / "web.yml"
        web.write_text(f"basic_auth_users:\n  prometheus: {stored.decode()}\n")
        poller = Poller(ExporterConfig(target="http://127.0.0.1:1"))
        server = make_server(poller, "127.0.0.1", 0, WebConfigSource(web))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        unknown, wrong = [], []
        for i in range(rounds):
            for user, into in (("mallory", unknown), ("prometheus", wrong)):
                started = time.perf_counter()
                assert httpx.get(url, auth=(user, f"guess {i}")).status_code == 401
                into.append(time.perf_counter() - started)
        server.shutdown()
        server.server_close()
    _report("over HTTP (a fresh connection each)", unknown, wrong)


def _report(where: str, unknown: list[float], wrong: list[float]) -> None:
    mu, mw = statistics.median(unknown), statistics.median(wrong)
    su, sw = statistics.stdev(unknown), statistics.stdev(wrong)
    print(
        f"auth {where}: unknown user median {mu * 1e3:.2f} ms (sd {su * 1e3:.2f}), "
        f"wrong password median {mw * 1e3:.2f} ms (sd {sw * 1e3:.2f}); "
        f"difference {(mu - mw) * 1e3:+.2f} ms ({(mu - mw) / mw:+.1%}) over {len(unknown)} each"
    )


# -- attacks ------------------------------------------------------------------------------


def slow_loris(port: int, stop: threading.Event) -> None:
    socks: list[socket.socket] = []
    for _ in range(500):
        with contextlib.suppress(OSError):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(HEAD)
            socks.append(s)
    while not stop.wait(1.0):
        for i, s in enumerate(socks):
            try:
                s.sendall(b"X")
            except OSError:  # cut off at the head deadline: come back, as a loris does
                with contextlib.suppress(OSError):
                    socks[i] = socket.create_connection(("127.0.0.1", port), timeout=5)
                    socks[i].sendall(HEAD)
    for s in socks:
        s.close()


def held_open(port: int, stop: threading.Event) -> None:
    socks = []
    for _ in range(1000):
        with contextlib.suppress(OSError):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
    stop.wait()
    for s in socks:
        s.close()


def big_bodies(port: int, stop: threading.Event) -> None:
    chunk = b"x" * (1024 * 1024)
    while not stop.is_set():
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 104857600\r\n\r\n")
            for _ in range(100):
                s.sendall(chunk)


def malformed(port: int, stop: threading.Event) -> None:
    lines = [b"GARBAGE\r\n\r\n", b"GET /metrics\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n",
             HEAD + b"no colon\r\n\r\n", b"\x16\x03\x01\x00\xff\r\n\r\n"]  # fmt: skip
    i = 0
    while not stop.is_set():
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(lines[i % len(lines)])
            s.recv(1024)
        i += 1


def scrape_once(port: int) -> bool:
    """One scrape on a fresh connection, as lean as a client can be: a complete 200?"""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(HEAD + b"Connection: close\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
    except OSError:
        return False
    head, _, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"Content-Length: (\d+)", head)
    return head.startswith(b"HTTP/1.1 200") and length is not None and len(body) == int(length[1])


def scrape_during(url: str, pid: int, attack: Callable[[int, threading.Event], None] | None,
                  seconds: float) -> None:  # fmt: skip
    port = int(url.rsplit(":", 1)[1])
    stop = threading.Event()
    attacker = threading.Thread(target=attack, args=(port, stop), daemon=True) if attack else None
    if attacker is not None:
        attacker.start()
        time.sleep(2.0)  # let it build up
    latencies: list[float] = []
    errors = 0
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        started = time.perf_counter()
        ok = scrape_once(port)
        latencies.append(time.perf_counter() - started)
        errors += not ok
    stop.set()
    if attacker is not None:
        attacker.join(timeout=30)
    name = attack.__name__.replace("_", " ") if attack else "no attack"
    mem = memory_kib(pid)
    p50, p99 = (percentile(latencies, q) * 1e3 for q in (0.5, 0.99))
    print(
        f"{name:<12}: {len(latencies)} scrapes, {errors} failed; latency p50 "
        f"{p50:.1f} ms, p99 {p99:.1f} ms, "
        f"max {max(latencies) * 1e3:.0f} ms; exporter RSS {mem['VmRSS'] / 1024:.1f} MiB, "
        f"peak so far {mem['VmHWM'] / 1024:.1f} MiB"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--auth-rounds", type=int, default=40)
    args = p.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    cpus = multiprocessing.cpu_count()
    print(f"python {sys.version.split()[0]}, {cpus} CPUs, bcrypt {bcrypt.__version__}")
    auth_timing(args.auth_rounds)

    ports: SimpleQueue[int] = multiprocessing.SimpleQueue()
    pages = {"one": [page(ONE_ENGINE).encode()]}
    server = multiprocessing.Process(target=_serve, args=(pages, ports), daemon=True)
    server.start()
    exporter, url = start_exporter(f"http://127.0.0.1:{ports.get()}/one")
    try:
        while "glassbox_target_up 1.0" not in httpx.get(url + "/metrics", timeout=30).text:
            time.sleep(0.2)
        for attack in (None, slow_loris, held_open, big_bodies, malformed):
            scrape_during(url, exporter.pid, attack, args.seconds)
    finally:
        exporter.terminate()
        exporter.wait(timeout=30)
        server.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
