"""Debian's Alertmanager (0.25) as a child process on loopback, and webhook receivers that
keep what they are sent.

`Alertmanager` writes its configuration into a work folder, starts with clustering off
(its default gossip port, 9094 on every interface, would collide between test runs),
waits for `/-/ready` and stops afterwards (`ChildProcess`). `Webhooks` is one loopback
HTTP server: each path is a receiver, and every POST is kept as the JSON Alertmanager's
webhook sends (`receiver`, `groupLabels`, `alerts`, ...). It also takes what Prometheus
and vmalert post to an Alertmanager's API, so it can stand in for one where no routing is
under test.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Self

import httpx
import yaml
from vllm_glassbox.lab.backends.server_process import ChildProcess, free_port


class Alertmanager(ChildProcess):
    def __init__(self, workdir: Path, config: Mapping[str, Any], port: int | None = None) -> None:
        self.workdir = workdir
        self.config = dict(config)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = workdir / "alertmanager.yml"
        super().__init__(
            [
                "prometheus-alertmanager",
                f"--config.file={self.config_path}",
                f"--storage.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",
                "--log.level=warn",
            ],
            workdir / "alertmanager.log",
            name="alertmanager",
        )

    def start(self, ready_timeout_seconds: float = 60.0) -> Self:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        super().start()
        try:
            self.wait_for(self._ready, ready_timeout_seconds, poll=0.2)
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool:
        try:
            return httpx.get(self.url + "/-/ready", timeout=2, trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert Alertmanager holds, with its status (`inhibitedBy`, `silencedBy`)
        and the receivers its routes chose (API v2)."""
        r = httpx.get(self.url + "/api/v2/alerts", timeout=10, trust_env=False)
        r.raise_for_status()
        alerts: list[dict[str, Any]] = r.json()
        return alerts


# --- the Prometheus Operator's AlertmanagerConfig, as the operator hands it to Alertmanager


def _matcher(m: Mapping[str, str]) -> str:
    return f'{m["name"]}{m.get("matchType", "=")}"{m["value"]}"'


def _route(route: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {"receiver": f"{prefix}/{route['receiver']}"}
    if "matchers" in route:
        out["matchers"] = [_matcher(m) for m in route["matchers"]]
    for key, name in (
        ("groupBy", "group_by"),
        ("groupWait", "group_wait"),
        ("groupInterval", "group_interval"),
        ("repeatInterval", "repeat_interval"),
        ("continue", "continue"),
    ):
        if key in route:
            out[name] = route[key]
    if "routes" in route:
        out["routes"] = [_route(child, prefix) for child in route["routes"]]
    return out


def operator_config(
    base: Mapping[str, Any], alertmanager_configs: list[Mapping[str, Any]]
) -> dict[str, Any]:
    """The Alertmanager configuration the Prometheus Operator generates from `base` and
    namespaced AlertmanagerConfig objects: each one's receivers renamed
    `<namespace>/<name>/<receiver>`; its route matched to its namespace, made `continue`,
    and put before the base's routes; each inhibition matched to its namespace on both
    sides (its default strategy, OnNamespace). A narrow stand-in for the operator, which
    cannot run here: only the fields the chart renders (webhook receivers among them)."""
    config = {**base, "route": dict(base["route"]), "receivers": list(base["receivers"])}
    config["inhibit_rules"] = list(base.get("inhibit_rules", []))
    routes = []
    for amc in alertmanager_configs:
        namespace, spec = amc["metadata"]["namespace"], amc["spec"]
        prefix = f"{namespace}/{amc['metadata']['name']}"
        in_namespace = f'namespace="{namespace}"'
        route = _route(spec["route"], prefix)
        route["matchers"] = [in_namespace, *route.get("matchers", [])]
        route["continue"] = True
        routes.append(route)
        for receiver in spec["receivers"]:
            webhooks = [
                {"url": w["url"], "send_resolved": w.get("sendResolved", True)}
                for w in receiver.get("webhookConfigs", [])
            ]
            config["receivers"].append(
                {"name": f"{prefix}/{receiver['name']}", "webhook_configs": webhooks}
            )
        for rule in spec.get("inhibitRules", []):
            config["inhibit_rules"].append(
                {
                    "source_matchers": [*map(_matcher, rule["sourceMatch"]), in_namespace],
                    "target_matchers": [*map(_matcher, rule["targetMatch"]), in_namespace],
                    "equal": rule["equal"],
                }
            )
    config["route"]["routes"] = [*routes, *config["route"].get("routes", [])]
    return config


class Webhooks:
    """Received POST bodies, by path."""

    def __init__(self, url: str) -> None:
        self.base_url = url
        self._received: dict[str, list[dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def url(self, path: str) -> str:
        return f"{self.base_url}/{path.lstrip('/')}"

    def keep(self, path: str, body: Any) -> None:
        with self._lock:
            self._received.setdefault(path, []).append(body)

    def paths(self) -> list[str]:
        with self._lock:
            return sorted(self._received)

    def received(self, path: str) -> list[Any]:
        with self._lock:
            return list(self._received.get("/" + path.lstrip("/"), []))


@contextlib.contextmanager
def webhooks() -> Iterator[Webhooks]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    hooks = Webhooks(f"http://127.0.0.1:{server.server_address[1]}")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            hooks.keep(self.path, json.loads(body or b"null"))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server.RequestHandlerClass = Handler
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hooks
    finally:
        server.shutdown()
        server.server_close()
