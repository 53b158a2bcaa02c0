"""The key of a vLLM started with `--api-key`: from a file or the environment, never in the
report, the results or a command line.

vLLM checks `Authorization: Bearer <key>` on its API (`/v1/…`); `/metrics` and `/health`
are open, but a proxy in front may guard them too, so every request the lab sends
carries it: the completions (`VllmClient`), the pages (the exporter's fetcher, the
poller), the benchmark (`OPENAI_API_KEY` in its environment, as `vllm bench serve` reads
it) and the exporter beside the server (`--target-bearer-token-file`). What reads
tokens from files gets one: the plan's own file, or — for a key from the environment —
a private copy (mode 0600) removed when the run ends.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass

from vllm_glassbox.core.fetch import TargetCredentials, read_token


@dataclass(frozen=True)
class ApiKeySource:
    """Where the plan says the key is (`api_key: {env: NAME}` or `api_key: {file: PATH}`)."""

    env: str | None = None
    file: str | None = None

    def describe(self) -> str:
        return f"the environment variable {self.env}" if self.env else f"the file {self.file}"


class ApiKey:
    """The key itself; its repr and str never show it."""

    def __init__(self, value: str, file: str, owned: bool = False) -> None:
        self._value = value
        self.file = file  # a file holding the key, for readers of token files
        self._owned = owned

    def __repr__(self) -> str:
        return "ApiKey(<hidden>)"

    __str__ = __repr__

    @property
    def value(self) -> str:
        return self._value

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._value}"}

    def credentials(self) -> TargetCredentials:
        return TargetCredentials(bearer_token_file=self.file)

    def close(self) -> None:
        """Remove the private copy of a key from the environment."""
        if self._owned:
            with contextlib.suppress(OSError):
                os.unlink(self.file)
            self._owned = False


#: Where the lab looks when the plan names no key: the file the chart's lab Job mounts from
#: a Secret, else the variable vLLM itself reads its key from.
KEY_FILE_VARIABLE = "VLLM_API_KEY_FILE"
KEY_VARIABLE = "VLLM_API_KEY"


def key_source(planned: ApiKeySource | None) -> ApiKeySource | None:
    """The plan's key source, else the environment's: VLLM_API_KEY_FILE, then VLLM_API_KEY."""
    if planned is not None:
        return planned
    if path := os.environ.get(KEY_FILE_VARIABLE):
        return ApiKeySource(file=path)
    if os.environ.get(KEY_VARIABLE, "").strip():
        return ApiKeySource(env=KEY_VARIABLE)
    return None


def open_api_key(source: ApiKeySource) -> ApiKey:
    """The key the source names; ValueError saying what is wrong (never the key)."""
    if source.file:
        try:
            return ApiKey(read_token(source.file), source.file)
        except (OSError, ValueError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise ValueError(f"api_key: cannot read {source.describe()}: {reason}") from None
    name = source.env or ""
    value = os.environ.get(name, "").strip()
    if not value:
        raise ValueError(f"api_key: {source.describe()} is not set or empty")
    fd, path = tempfile.mkstemp(prefix="glassbox-api-key-")  # mode 0600
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(value)
    return ApiKey(value, path, owned=True)
