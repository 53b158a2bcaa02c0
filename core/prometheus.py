"""Prometheus' HTTP API: the one client the dashboards' pictures, the lab and the tests use.

    with Prometheus("http://127.0.0.1:9090") as prometheus:
        prometheus.query("up == 1")

Every failure — Prometheus unreachable, an answer that is not its JSON API, a query it
rejects — is a `PrometheusError` that names it.
"""

from __future__ import annotations

from typing import Any

import httpx
import yaml
from vllm_glassbox.core.units import parse_duration


class PrometheusError(RuntimeError):
    pass


class Prometheus:
    """The calls glassbox makes: instant and range queries, the scrape interval, the
    active targets, and whether the server is ready."""

    def __init__(self, url: str, timeout_seconds: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._client = httpx.Client(timeout=timeout_seconds, trust_env=False)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Prometheus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _get(self, path: str, params: dict[str, str | float]) -> Any:
        try:
            r = self._client.get(self.url + path, params=params)
        except httpx.HTTPError as e:
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {e}") from None
        try:
            body = r.json()
        except ValueError:
            raise PrometheusError(
                f"{self.url}{path}: HTTP {r.status_code}, not Prometheus' JSON API"
            ) from None
        if body.get("status") != "success":
            raise PrometheusError(f"{body.get('errorType', 'error')}: {body.get('error', body)}")
        return body["data"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        params: dict[str, str | float] = {"query": expr, "start": start, "end": end, "step": step}
        result: list[dict[str, Any]] = self._get("/api/v1/query_range", params)["result"]
        return result

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query (at `at`, unix seconds; else now): the instant vector, or the
        samples of a range selector (`up[5m]`)."""
        params: dict[str, str | float] = {"query": expr}
        if at is not None:
            params["time"] = at
        data = self._get("/api/v1/query", params)
        if data.get("resultType") not in ("vector", "matrix"):
            raise PrometheusError(f"expected an instant vector, got {data.get('resultType')}")
        result: list[dict[str, Any]] = data["result"]
        return result

    def scrape_interval(self) -> float:
        """The global scrape interval from Prometheus' loaded configuration."""
        config = yaml.safe_load(self._get("/api/v1/status/config", {})["yaml"]) or {}
        return parse_duration(str(config.get("global", {}).get("scrape_interval", "1m")))

    def active_targets(self) -> list[dict[str, Any]]:
        """The targets Prometheus scrapes, each with its labels, health and last error."""
        targets: list[dict[str, Any]] = self._get("/api/v1/targets", {})["activeTargets"]
        return targets

    def ready(self) -> bool:
        """Whether Prometheus says it is ready to serve queries (`/-/ready`)."""
        try:
            return self._client.get(self.url + "/-/ready").status_code == 200
        except httpx.HTTPError:
            return False
