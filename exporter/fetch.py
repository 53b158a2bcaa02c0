"""Fetching vLLM's pages: one hard deadline per poll and a cap on decoded bytes.

httpx's timeouts are per read, so a server dripping one byte at a time never trips them;
we check a wall-clock deadline between chunks. Bodies are read raw and inflated here with
a bound, so a gzip bomb costs at most the cap, whatever the server claims.
"""

from __future__ import annotations

import time
import zlib

import httpx

from .textformat import PageError


class Fetcher:
    def __init__(self, base_url: str, timeout_seconds: float, max_bytes: int) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_seconds = timeout_seconds
        self.max_bytes = max_bytes
        # One client: keep-alive to the sidecar's neighbour; no redirects, no env proxies.
        self._client = httpx.Client(follow_redirects=False, trust_env=False)

    def close(self) -> None:
        self._client.close()

    def get_text(self, path: str) -> str:
        """GET base_url + path as text, or raise PageError with the reason."""
        deadline = time.monotonic() + self.timeout_seconds
        try:
            return self._get(path, deadline)
        except PageError:
            raise
        except httpx.TimeoutException:
            raise PageError(
                "timeout", f"{path}: no answer within {self.timeout_seconds:g}s"
            ) from None
        except httpx.HTTPError as e:
            raise PageError("connect", f"{path}: {type(e).__name__}: {e}") from None

    def _get(self, path: str, deadline: float) -> str:
        timeout = httpx.Timeout(self.timeout_seconds)
        headers = {"Accept-Encoding": "identity", "Accept": "text/plain"}
        with self._client.stream(
            "GET", self.base_url + path, headers=headers, timeout=timeout
        ) as response:
            if response.status_code != 200:
                raise PageError("http_status", f"{path}: HTTP {response.status_code}")
            declared = response.headers.get("content-length", "")
            encoding = response.headers.get("content-encoding", "identity").lower()
            if encoding == "identity" and declared.isdigit() and int(declared) > self.max_bytes:
                raise PageError(
                    "too_large", f"{path}: {declared} bytes announced (cap {self.max_bytes})"
                )
            inflater = _inflater(encoding)
            body = bytearray()
            for chunk in response.iter_raw():
                if time.monotonic() > deadline:
                    raise PageError(
                        "timeout", f"{path}: body not complete within {self.timeout_seconds:g}s"
                    )
                room = self.max_bytes + 1 - len(body)
                if inflater is None:
                    body += chunk[:room]
                else:
                    try:
                        body += inflater.decompress(chunk, room)
                    except zlib.error as e:
                        raise PageError("decode", f"{path}: bad {encoding} body: {e}") from None
                    if inflater.unconsumed_tail:
                        body += b"x"  # more was coming: over the cap
                if len(body) > self.max_bytes:
                    raise PageError("too_large", f"{path}: body exceeds {self.max_bytes} bytes")
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise PageError("decode", f"{path}: not UTF-8 ({e.reason} at byte {e.start})") from None


def _inflater(encoding: str) -> zlib._Decompress | None:
    if encoding in ("identity", ""):
        return None
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return zlib.decompressobj()
    raise PageError("decode", f"unsupported Content-Encoding {encoding!r}")
