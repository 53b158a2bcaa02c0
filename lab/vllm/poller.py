"""The lab's poller, a process of its own: GET URL/metrics on a fixed period, each page or
failure appended as one JSON line to a file, with when it was sent and when it came back.

    python -m vllm_glassbox.lab.vllm.poller URL PERIOD DEADLINE FILE [TOKEN_FILE]

Apart from the lab's process, its schedule cannot be held up by what that process does
(the request load, the exporter beside the server, writing the report): the times it
records are the times the pages came. It writes to a file, never to a pipe, so a reader
that falls behind cannot block it. It stops when its stdin closes (the lab ended, however
it ended) or on SIGTERM. `client.Sampler` starts it and reads the file. TOKEN_FILE: a
vLLM started with --api-key (or behind a token-checking proxy), read as the exporter does.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

from vllm_glassbox.core.errors import ScrapeError
from vllm_glassbox.core.fetch import Fetcher, TargetCredentials
from vllm_glassbox.core.ticker import ticks


def poll_forever(
    url: str,
    period: float,
    deadline: float,
    path: str,
    stop: threading.Event,
    token_file: str | None = None,
) -> None:
    # The exporter's fetcher: one hard deadline per poll, whatever the server does.
    fetcher = Fetcher(url, deadline, credentials=TargetCredentials(bearer_token_file=token_file))
    with open(path, "a", encoding="utf-8") as out:
        # A poll that came back late is followed at once, the period counted from there.
        for due in ticks(period, stop, after_overrun="at once"):
            sent = time.monotonic()
            # When it meant to poll, too: a poll sent late means the machine was starved.
            line: dict[str, object] = {"scheduled": due, "sent": sent}
            try:
                line["page"] = fetcher.get_text("/metrics")
            except ScrapeError as e:
                line["error"] = str(e)
            line["received"] = time.monotonic()
            out.write(json.dumps(line) + "\n")
            out.flush()
    fetcher.close()


def main(argv: list[str]) -> int:
    url, period, deadline, path = argv[0].rstrip("/"), float(argv[1]), float(argv[2]), argv[3]
    token_file = argv[4] if len(argv) > 4 else None
    stop = threading.Event()

    def until_stdin_closes() -> None:
        sys.stdin.buffer.read()  # returns at EOF: the lab is gone
        stop.set()

    threading.Thread(target=until_stdin_closes, daemon=True).start()
    poll_forever(url, period, deadline, path, stop, token_file)
    return 0


if __name__ == "__main__":
    # Ctrl-C reaches the whole terminal's process group: the lab decides when to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    raise SystemExit(main(sys.argv[1:]))
