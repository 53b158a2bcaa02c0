"""Sampled completions that outgrow vLLM's KV pool, streamed by a child process of the
real stack (tests/realstack.py) until it is stopped. Reading the streams costs the test
process no CPU; stopping the child closes them, which cancels the requests in vLLM.

    python -m tests.fill_requests URL MODEL REQUESTS MAX_TOKENS
"""

from __future__ import annotations

import sys
import threading

import httpx


def stream(url: str, model: str, prompt: str, max_tokens: int) -> None:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for _ in r.iter_raw():
            pass


def main(argv: list[str]) -> None:
    url, model, requests, max_tokens = argv[0], argv[1], int(argv[2]), int(argv[3])
    threads = [
        threading.Thread(
            target=stream,
            args=(
                url,
                model,
                f"Write an extremely long and detailed essay, number {i}.",
                max_tokens,
            ),
        )
        for i in range(requests)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main(sys.argv[1:])
