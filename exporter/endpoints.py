"""What the exporter's endpoints answer, as prometheus_client and node_exporter do.

`/metrics` negotiates its format and its compression from the request's header fields,
with prometheus_client's own rules: `Accept: application/openmetrics-text` gets
OpenMetrics, anything else the classic text format; `Accept-Encoding: gzip` gets the body
gzipped (Prometheus asks for both). `/findings` is what `glassbox explain` finds over the
latest poll, in JSON. `/` is a landing page that says what is running, what it polls and
whether its last poll worked, with links.
"""

from __future__ import annotations

import datetime
import gzip
import html
import json
from collections.abc import Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted
from vllm_glassbox.core.build import Build
from vllm_glassbox.explain.from_exporter import findings_document
from vllm_glassbox.exporter.exposition import PollState, unrecognised_inputs
from vllm_glassbox.exporter.scene import scene_from_state
from vllm_glassbox.exporter.server import Answer

DOCS = "https://github.com/vllm-glassbox/vllm-glassbox/blob/main/docs/exporter.md"


def metrics_answer(registry: CollectorRegistry, headers: Mapping[str, str]) -> Answer:
    """The registry encoded as the client asked (format, then gzip)."""
    encode, content_type = choose_encoder(headers.get("accept", ""))
    body = encode(registry)
    if gzip_accepted(headers.get("accept-encoding", "")):
        # Level 6, as prometheus_client; mtime 0: the same page gives the same bytes.
        return Answer(
            200,
            gzip.compress(body, compresslevel=6, mtime=0),
            content_type,
            (("Content-Encoding", "gzip"), ("Vary", "Accept-Encoding")),
        )
    return Answer(200, body, content_type, (("Vary", "Accept-Encoding"),))


def landing_page(
    build: Build,
    target: str,
    up: bool | None,
    problem: str | None,
    last_success_unix: float | None,
) -> bytes:
    """The HTML of `/`: version, target, the last poll's outcome, links."""
    if up is None:
        status = "not polled yet"
    elif up:
        status = "the last poll worked"
    else:
        status = "the last poll failed" + (f": {problem}" if problem else "")
    if last_success_unix is not None:
        when = datetime.datetime.fromtimestamp(last_success_unix, datetime.UTC)
        status += f" (last success {when.isoformat(timespec='seconds')})"
    else:
        status += " (no successful poll yet)"
    e = html.escape
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>glassbox exporter</title></head><body>
<h1>vllm-glassbox exporter</h1>
<p>Derived series of one vLLM server, polled in the background.</p>
<table>
<tr><th>version</th><td>{e(build.version)}</td></tr>
<tr><th>revision</th><td>{e(build.revision)}</td></tr>
<tr><th>Python</th><td>{e(build.python_version)}</td></tr>
<tr><th>target</th><td>{e(target)}</td></tr>
<tr><th>last poll</th><td>{e(status)}</td></tr>
</table>
<ul>
<li><a href="/metrics">/metrics</a>: the series</li>
<li><a href="/healthz">/healthz</a>: liveness of the exporter (not of vLLM)</li>
<li><a href="{DOCS}">docs/exporter.md</a>: what each series means</li>
</ul>
</body></html>
""".encode()


def findings_answer(state: PollState | None) -> Answer:
    """`/findings`: what `glassbox explain` finds over the latest poll, and the scene it
    read (JSON; a Grafana panel or `glassbox explain --exporter` reads it)."""
    if state is None:
        return Answer(503, b"not polled yet\n", "text/plain")
    scene = scene_from_state(state, unrecognised_inputs(state))
    body = json.dumps(findings_document(scene), indent=1) + "\n"
    return Answer(200, body.encode(), "application/json")
