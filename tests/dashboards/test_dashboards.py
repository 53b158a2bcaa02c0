"""The dashboards: generated JSON in sync, valid PromQL, real series, sound arithmetic;
and the snapshot command against a real Prometheus holding known data.

No Grafana server can run here, so the JSON is checked for what Grafana would need
(fixed unique uids, variables, a grid without overlaps) and the queries are checked
against the sources of truth: vLLM's names per version (tests/vllm_metric_names.py), the
exporter's actual output (rendered from a made-up poll), the lab's phase series, and the
recording rules and alerts in alerts/*.yaml.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from vllm_glassbox.core.prometheus import Prometheus
from vllm_glassbox.core.series import WINDOWED
from vllm_glassbox.dashboards import catalog
from vllm_glassbox.dashboards import queries as q
from vllm_glassbox.dashboards.cli import main
from vllm_glassbox.dashboards.common import LAB_ANNOTATION_TAG
from vllm_glassbox.dashboards.formatting import format_value
from vllm_glassbox.dashboards.grafana import (
    TimeRange,
    legend,
    parse_time,
    substitute,
    time_range,
    variable_names,
)
from vllm_glassbox.dashboards.panel_data import (
    PanelData,
    Region,
    Series,
    TargetData,
    query_annotations,
    regions,
    stacked_bar_cells,
)
from vllm_glassbox.dashboards.pictures import draw_pictures
from vllm_glassbox.dashboards.visualizations import with_gaps
from vllm_glassbox.exporter.service import ExporterConfig, Poller, make_registry
from vllm_glassbox.lab.backends.prometheus_process import PrometheusProcess
from vllm_glassbox.lab.backends.server_process import free_port
from vllm_glassbox.lab.telemetry import GrafanaAnnotations, PhaseInfo, Segment

from tests import vllm_metric_names as vllm
from tests.fixtures import log as fixture_log

REPO = Path(__file__).resolve().parents[2]
BOARDS = [catalog.as_json(d) for d in catalog.dashboards()]
# Substitution for checks: Grafana's "All" and a plausible range.
SPAN = TimeRange(start=0.0, end=3600.0, step=15.0, scrape_interval=15.0)


def expressions() -> Iterator[tuple[str, str]]:
    """(where, PromQL with variables substituted) for every query the dashboards make."""
    for board in BOARDS:
        names = variable_names(board)
        uid = board["uid"]
        for panel in _panels(board):
            for target in panel["targets"]:
                where = f"{uid} / {panel['title']} / {target['refId']}"
                yield where, substitute(target["expr"], names, SPAN)
        for annotation in board["annotations"]["list"]:
            if "expr" in annotation:
                yield (
                    f"{uid} / annotation {annotation['name']}",
                    substitute(annotation["expr"], names, SPAN),
                )
        for variable in board["templating"]["list"]:
            if variable["type"] == "query":
                # label_values(SELECTOR, label): the selector is PromQL.
                selector = variable["query"].removeprefix("label_values(").rsplit(",", 1)[0]
                yield f"{uid} / variable {variable['name']}", substitute(selector, names, SPAN)


def _panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in board["panels"] if p["type"] != "row"]


# --- walking the PromQL AST -----------------------------------------------------------------


def _children(node: Any) -> list[Any]:
    if isinstance(node, promql_parser.BinaryExpr):
        return [node.lhs, node.rhs]
    if isinstance(node, promql_parser.AggregateExpr):
        return [node.expr] + ([node.param] if node.param is not None else [])
    if isinstance(node, promql_parser.Call):
        return list(node.args)
    if isinstance(node, promql_parser.MatrixSelector):
        return [node.vector_selector]
    if isinstance(
        node, promql_parser.ParenExpr | promql_parser.UnaryExpr | promql_parser.SubqueryExpr
    ):
        return [node.expr]
    return []


def _nodes(node: Any) -> Iterator[Any]:
    yield node
    for child in _children(node):
        yield from _nodes(child)


def selected_names(expr: str) -> set[str]:
    """Series names an expression selects, including `{__name__=~"a|b"}` alternatives."""
    names: set[str] = set()
    for node in _nodes(promql_parser.parse(expr)):
        if not isinstance(node, promql_parser.VectorSelector):
            continue
        if node.name:
            names.add(node.name)
        for m in node.matchers.matchers:
            if m.name == "__name__":
                names.update(m.value.split("|"))
    return names


def _alertnames(node: Any) -> set[str]:
    """The alert names an ALERTS selector picks (`a|b` alternatives of a regex split)."""
    return {v for m in node.matchers.matchers if m.name == "alertname" for v in m.value.split("|")}


_RATE_FUNCTIONS = {"rate", "irate", "increase"}


def bare_counters(expr: str, cumulative: set[str]) -> list[str]:
    """Cumulative series used anywhere but directly inside rate/irate/increase."""
    found: list[str] = []

    def visit(node: Any, in_rate: bool) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name in cumulative and not in_rate:
                found.append(node.name)
            return
        if isinstance(node, promql_parser.Call):
            for arg in node.args:
                in_this = node.func.name in _RATE_FUNCTIONS and isinstance(
                    arg, promql_parser.MatrixSelector
                )
                visit(arg, in_this)
            return
        for child in _children(node):
            visit(child, in_rate and isinstance(node, promql_parser.MatrixSelector))

    visit(promql_parser.parse(expr), False)
    return found


def _unparen(node: Any) -> Any:
    while isinstance(node, promql_parser.ParenExpr):
        node = node.expr
    return node


def _is_guarded(denominator: Any) -> bool:
    d = _unparen(denominator)
    if isinstance(d, promql_parser.NumberLiteral):
        return d.val != 0
    if isinstance(d, promql_parser.BinaryExpr) and not (d.modifier and d.modifier.return_bool):
        bound = _unparen(d.rhs)
        if isinstance(bound, promql_parser.NumberLiteral):
            return (str(d.op) == ">" and bound.val >= 0) or (str(d.op) == ">=" and bound.val > 0)
    if isinstance(d, promql_parser.Call) and d.func.name == "clamp_min":
        low = _unparen(d.args[1])
        return isinstance(low, promql_parser.NumberLiteral) and low.val > 0
    return False


def unguarded_divisions(expr: str) -> list[str]:
    """Denominators that can be 0 (NaN or ±Inf instead of no value)."""
    return [
        node.rhs.prettify()
        for node in _nodes(promql_parser.parse(expr))
        if isinstance(node, promql_parser.BinaryExpr)
        and str(node.op) == "/"
        and not _is_guarded(node.rhs)
    ]


# --- the series that exist ----------------------------------------------------------------


def _page(scale: float) -> str:
    """A vLLM page with every series the exporter reads; counters grow with `scale`."""
    e = 'engine="0",model_name="m"'
    lines = [
        f"vllm:generation_tokens_total{{{e}}} {100 * scale}",
        f"vllm:prompt_tokens_total{{{e}}} {50 * scale}",
        f"vllm:time_to_first_token_seconds_sum{{{e}}} {1 * scale}",
        f"vllm:time_to_first_token_seconds_count{{{e}}} {2 * scale}",
        f"vllm:inter_token_latency_seconds_sum{{{e}}} {3 * scale}",
        f"vllm:inter_token_latency_seconds_count{{{e}}} {40 * scale}",
        f"vllm:iteration_tokens_total_count{{{e}}} {30 * scale}",
        f"vllm:num_preemptions_total{{{e}}} {1 * scale}",
        f"vllm:e2e_request_latency_seconds_count{{{e}}} {2 * scale}",
        f"vllm:spec_decode_num_drafts_total{{{e}}} {20 * scale}",
        f"vllm:spec_decode_num_draft_tokens_total{{{e}}} {100 * scale}",
        f"vllm:spec_decode_num_accepted_tokens_total{{{e}}} {60 * scale}",
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{e},position="0"}} {18 * scale}',
        # Nothing finished at the first poll: the next requests are the first after start.
        f"vllm:request_prefill_time_seconds_sum{{{e}}} {0.5 * (scale - 1)}",
        f"vllm:request_prefill_time_seconds_count{{{e}}} {2 * (scale - 1)}",
        f"vllm:request_prompt_tokens_sum{{{e}}} {50 * (scale - 1)}",
        f"vllm:request_prompt_tokens_count{{{e}}} {2 * (scale - 1)}",
        f"vllm:request_generation_tokens_sum{{{e}}} {100 * (scale - 1)}",
        f"vllm:request_generation_tokens_count{{{e}}} {2 * (scale - 1)}",
        # A KV consumer joined by NIXL, with adapters (every disaggregation series).
        *(
            f'vllm:prompt_tokens_by_source_total{{{e},source="{source}"}} {n * scale}'
            for source, n in (
                ("local_compute", 5),
                ("local_cache_hit", 5),
                ("external_kv_transfer", 40),
            )
        ),
        f'vllm:num_requests_kv_fetch_by_stage{{{e},stage="in_progress"}} 1',
        f"vllm:nixl_xfer_time_seconds_sum{{{e}}} {0.1 * scale}",
        f"vllm:nixl_xfer_time_seconds_count{{{e}}} {2 * scale}",
        f"vllm:nixl_bytes_transferred_sum{{{e}}} {1e6 * scale}",
        f"vllm:nixl_num_failed_transfers_total{{{e}}} {scale}",
        f"vllm:nixl_num_kv_expired_reqs_total{{{e}}} {scale}",
        f'vllm:num_requests_waiting_by_reason{{{e},reason="capacity"}} 0',
        f'vllm:num_requests_waiting_by_reason{{{e},reason="deferred"}} 1',
        'vllm:lora_requests_info{max_lora="1",running_lora_adapters="a",'
        'waiting_lora_adapters="b"} 1700000000',
        f"vllm:num_requests_running{{{e}}} 2",
        f"vllm:num_requests_waiting{{{e}}} 1",
        f"vllm:kv_cache_usage_perc{{{e}}} {min(0.25 * scale, 1.0)}",  # the pool fills
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="256"} 1',
        "process_start_time_seconds 1700000000",
    ]
    return "\n".join(lines) + "\n"


class _GrowingVllm(BaseHTTPRequestHandler):
    """A loopback vLLM whose counters grow with every /metrics request."""

    polls = 0

    def do_GET(self) -> None:
        if self.path == "/version":
            body = b'{"version": "0.32.0"}'
        else:
            type(self).polls += 1
            body = _page(float(self.polls)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _exporter_families(tmp_path: Path) -> dict[str, str]:
    """Sample name -> family type, of everything the exporter serves after three polls."""
    log = tmp_path / "vllm.log"
    log.write_text(fixture_log("v0.11.0-coldstart.log"))  # a whole start, every stage
    server = ThreadingHTTPServer(("127.0.0.1", 0), _GrowingVllm)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        config = ExporterConfig(
            target=f"http://127.0.0.1:{server.server_address[1]}",
            weights_bytes=1e9,
            peak_bandwidth=1e12,
            kv_link_bandwidth=1e9,
            vllm_log=str(log),
            interval_seconds=1.0,
            gpu_hour_price=3.5,
        )
        poller = Poller(config)
        # Three polls: the warm prefill mean needs requests after the first ones.
        assert poller.poll_once() and poller.poll_once() and poller.poll_once()
        return {s.name: f.type for f in make_registry(poller).collect() for s in f.samples}
    finally:
        server.shutdown()
        server.server_close()


def _lab_series() -> set[str]:
    phase = PhaseInfo()
    phase.segment_started(Segment("p", "kind", "variant", 0.0))
    return {s.name for f in phase.registry.collect() for s in f.samples}


def _rule_files() -> list[dict[str, Any]]:
    """alerts/*.yaml, and the SLO rules an SLO file renders (the example's)."""
    paths = [*sorted((REPO / "alerts").glob("*.yaml")), REPO / "alerts/slo/example.rules.yaml"]
    return [yaml.safe_load(p.read_text()) for p in paths]


def _rules(key: str) -> set[str]:
    return {
        str(rule[key])
        for doc in _rule_files()
        for group in doc.get("groups", [])
        for rule in group.get("rules", [])
        if key in rule
    }


# vLLM series shown only by some supported releases; each one's panel still works on the
# others (say how).
VERSION_SPECIFIC = {
    "vllm:num_requests_waiting_by_reason": "v0.20+; the same panel shows "
    "vllm:num_requests_waiting, which every version has",
    "vllm:num_requests_kv_fetch_by_stage": "v0.32+, only on a KV consumer; the prefill/"
    "decode row is empty without disaggregation",
}


@pytest.fixture(scope="module")
def exporter_families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return _exporter_families(tmp_path_factory.mktemp("exporter"))


# --- generation ---------------------------------------------------------------------------


def test_checked_in_json_matches_the_sources() -> None:
    assert catalog.drift() == [], "run `glassbox dashboards generate` and commit the result"


def test_uids_are_fixed_unique_and_name_the_files() -> None:
    uids = [d.uid for d in catalog.dashboards()]
    assert uids == [
        "glassbox-overview",
        "glassbox-decode",
        "glassbox-kv-cache",
        "glassbox-spec-decode",
        "glassbox-fleet",
        "glassbox-slo",
        "glassbox-disaggregation",
    ]
    assert all(len(uid) <= 40 for uid in uids)  # Grafana's limit
    assert sorted(p.stem for p in catalog.GENERATED_DIR.glob("*.json")) == sorted(uids)


def test_generate_twice_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--out", str(tmp_path)]) == 0
    first = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    assert main(["generate", "--out", str(tmp_path)]) == 0
    second = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    assert first == second
    assert (
        first["glassbox-overview.json"][0]
        == (catalog.GENERATED_DIR / "glassbox-overview.json").read_bytes()
    )


def test_generate_check_names_every_drifting_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["generate", "--out", str(tmp_path)])
    capsys.readouterr()
    assert main(["generate", "--check", "--out", str(tmp_path)]) == 0
    edited = tmp_path / "glassbox-decode.json"
    edited.write_text(edited.read_text().replace("Decode efficiency", "Decode"))
    (tmp_path / "glassbox-spec-decode.json").unlink()
    (tmp_path / "old-board.json").write_text("{}\n")

    assert main(["generate", "--check", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    for name in ("glassbox-decode.json", "glassbox-spec-decode.json", "old-board.json"):
        assert f"{tmp_path / name}: differs" in err
    assert "glassbox-overview.json" not in err

    assert main(["generate", "--out", str(tmp_path)]) == 0
    assert not (tmp_path / "old-board.json").exists()
    assert main(["generate", "--check", "--out", str(tmp_path)]) == 0


# --- the JSON Grafana imports -------------------------------------------------------------


def test_every_dashboard_has_the_variables_and_the_lab_annotations() -> None:
    for board in BOARDS:
        variables = [v["name"] for v in board["templating"]["list"]]
        assert variables == [
            "datasource",
            "cluster",
            "namespace",
            "job",
            "pod",
            "model_name",
            "engine",
        ]
        annotations = {a["name"]: a for a in board["annotations"]["list"]}
        assert "glassbox_lab_phase_info" in annotations["Lab phases"]["expr"]
        assert annotations["Lab annotations"]["target"]["tags"] == [LAB_ANNOTATION_TAG]


def test_every_dashboard_links_to_the_others_keeping_time_and_variables() -> None:
    for board in BOARDS:
        assert board["tags"] == ["vllm", "glassbox"]
        (link,) = board["links"]
        assert link["type"] == "dashboards" and link["tags"] == ["glassbox"]
        assert link["keepTime"] and link["includeVars"]


def test_every_query_narrows_to_the_picked_cluster_and_namespace() -> None:
    """A selector without the fleet's variables would mix clusters and teams."""
    checked = 0
    for where, expr in expressions():
        if "/ variable " in where:
            continue  # each variable is narrowed by the ones before it
        for node in _nodes(promql_parser.parse(expr)):
            if isinstance(node, promql_parser.VectorSelector):
                labels = {m.name for m in node.matchers.matchers}
                assert {"cluster", "namespace"} <= labels, (where, expr)
                checked += 1
    assert checked > 100


def test_fleet_view_uses_the_bandwidth_alerts_threshold_and_counts_every_alert() -> None:
    from tests.rules.test_rules import ALERT_RULES

    assert f"< {q.BANDWIDTH_LOW}" in ALERT_RULES["VLLMDecodeBandwidthLow"]["expr"]
    assert set(q.GLASSBOX_ALERTS) == set(ALERT_RULES)


def test_lab_annotations_carry_the_tag_the_dashboards_filter_on() -> None:
    segment = Segment("spec", "spec-decode", "", 0.0)
    body = GrafanaAnnotations("http://grafana", "token").body(segment, 1.0, None)
    assert LAB_ANNOTATION_TAG in body["tags"]  # type: ignore[operator]


def test_panels_fill_the_grid_without_overlapping() -> None:
    for board in BOARDS:
        taken: dict[tuple[int, int], str] = {}
        for panel in board["panels"]:
            g = panel["gridPos"]
            assert g["x"] >= 0 and g["x"] + g["w"] <= 24, panel["title"]
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    assert (x, y) not in taken, f"{panel['title']} overlaps {taken[(x, y)]}"
                    taken[(x, y)] = panel["title"]


def test_every_panel_says_what_it_shows_and_in_which_unit() -> None:
    for board in BOARDS:
        for panel in _panels(board):
            where = f"{board['uid']} / {panel['title']}"
            assert len(panel["description"]) > 30, where
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
            if panel["type"] in ("timeseries", "stat"):
                assert panel["fieldConfig"]["defaults"]["unit"], where
                assert all(t["legendFormat"] for t in panel["targets"]), where
            ref_ids = [t["refId"] for t in panel["targets"]]
            assert len(set(ref_ids)) == len(ref_ids) > 0, where


def test_descriptions_quote_the_exporters_help_text() -> None:
    helps = {s.name: s.help for s in WINDOWED}
    quoted = 0
    for board in BOARDS:
        for panel in _panels(board):
            for name in {n for t in panel["targets"] for n in selected_names(_sub(t["expr"]))}:
                if name in helps:
                    assert helps[name] in panel["description"], (panel["title"], name)
                    quoted += 1
    assert quoted > 10


def _sub(expr: str) -> str:
    return substitute(expr, ["cluster", "namespace", "job", "pod", "model_name", "engine"], SPAN)


# --- the queries --------------------------------------------------------------------------


def test_every_expression_parses_as_promql() -> None:
    exprs = list(expressions())
    assert len(exprs) > 100
    problems = []
    for where, expr in exprs:
        try:
            promql_parser.parse(expr)
        except ValueError as e:
            problems.append(f"{where}: {e}: {expr}")
    assert not problems, "\n".join(problems)


@pytest.mark.prometheus
def test_prometheus_itself_accepts_every_expression(tmp_path: Path) -> None:
    rules = [
        {"record": f"dashboard:expression_{i}:check", "expr": expr}
        for i, (_, expr) in enumerate(expressions())
    ]
    path = tmp_path / "dashboards.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    run = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"SUCCESS: {len(rules)} rules found" in run.stdout


# The fleet recording rules the dashboards are built on (alerts/glassbox-rules.yaml).
FLEET_RULES = {
    f"namespace_job_model_name:{name}"
    for name in (
        "vllm_time_per_output_token_seconds:rate5m",
        "vllm_inter_token_latency_seconds:rate5m",
        "vllm_tokens_per_forward_pass:rate5m",
        "vllm_tokens_per_engine_step:rate5m",
        "vllm_engine_steps:rate5m",
        "vllm_generation_tokens:rate5m",
        "vllm_num_preemptions:rate5m",
        "vllm_spec_decode_acceptance_ratio:rate5m",
        "vllm_spec_decode_mean_acceptance_length:rate5m",
        "vllm_spec_decode_draft_coverage_ratio:rate5m",
        "vllm_kv_cache_usage:max",
        "vllm_num_requests_waiting:sum",
        "vllm_num_requests_running:sum",
        "glassbox_kv_cache_used_tokens:sum",
        "glassbox_kv_cache_capacity_tokens:sum",
    )
} | {"namespace_job_model_name_position:vllm_spec_decode_acceptance_ratio:rate5m"}


def test_every_series_exists(exporter_families: dict[str, str]) -> None:
    records, alerts = _rules("record"), _rules("alert")
    assert records >= FLEET_RULES and "VLLMPreemptionStorm" in alerts
    exporter, lab = set(exporter_families), _lab_series()
    for name, why in VERSION_SPECIFIC.items():
        assert name in vllm.IN_SOME_SUPPORTED_VERSION, f"{name} ({why}) is no vLLM series"
    problems = []
    seen: set[str] = set()
    for where, expr in expressions():
        for node in _nodes(promql_parser.parse(expr)):
            if isinstance(node, promql_parser.VectorSelector) and node.name == "ALERTS":
                unknown = _alertnames(node) - alerts
                if unknown or not _alertnames(node):
                    problems.append(f"{where}: ALERTS for an unknown alert {unknown or '?'}")
        for name in selected_names(expr):
            seen.add(name)
            known = (
                name in vllm.IN_EVERY_SUPPORTED_VERSION
                or name in VERSION_SPECIFIC
                or name in exporter
                or name in records
                or name in lab
                or name == "ALERTS"
            )
            if not known:
                problems.append(
                    f"{where}: {name} is no series of vLLM, the exporter, the lab or the rules"
                )
    assert not problems, "\n".join(problems)
    # The dashboards use the fleet rules and everything the exporter derives.
    assert seen >= FLEET_RULES, f"fleet rules no panel shows: {FLEET_RULES - seen}"
    windowed = {s.name for s in WINDOWED}
    assert windowed <= seen, f"exporter series no panel shows: {windowed - seen}"


def test_counters_appear_only_inside_rate_or_increase(exporter_families: dict[str, str]) -> None:
    cumulative = {
        name
        for name, metric in vllm.BY_SAMPLE_NAME.items()
        if metric.kind in ("counter", "histogram")
    } | {name for name, kind in exporter_families.items() if kind == "counter"}
    assert "vllm:time_to_first_token_seconds_bucket" in cumulative
    assert "glassbox_scrape_errors_total" in cumulative
    # The check can fail: a lifetime ratio of two counters is caught.
    assert bare_counters(
        "vllm:generation_tokens_total / rate(vllm:prompt_tokens_total[5m])", cumulative
    ) == ["vllm:generation_tokens_total"]
    assert bare_counters("rate(vllm:generation_tokens_total[5m:1m])", cumulative)

    problems = [
        f"{where}: {names}"
        for where, expr in expressions()
        if (names := bare_counters(expr, cumulative))
    ]
    assert not problems, "\n".join(problems)


def test_every_division_guards_its_denominator() -> None:
    # The check can fail: an unguarded denominator and a `bool` comparison are caught.
    assert unguarded_divisions("sum(rate(a[5m])) / sum(rate(b[5m]))") == ["sum(rate(b[5m]))"]
    assert unguarded_divisions("a / (b > bool 0)")
    assert unguarded_divisions("a / (b > 0)") == []
    divisions = 0
    problems = []
    for where, expr in expressions():
        divisions += sum(
            1
            for n in _nodes(promql_parser.parse(expr))
            if isinstance(n, promql_parser.BinaryExpr) and str(n.op) == "/"
        )
        problems += [f"{where}: {d}" for d in unguarded_divisions(expr)]
    assert divisions > 0
    assert not problems, "\n".join(problems)


# --- snapshot: the pure parts -------------------------------------------------------------


def test_times_are_unix_seconds_rfc3339_or_relative() -> None:
    now = 1_732_896_000.0
    assert parse_time("1700000000.5", now) == 1_700_000_000.5
    assert parse_time("2024-11-29T16:00:00Z", now) == 1_732_896_000.0
    assert parse_time("2024-11-29T17:00:00+01:00", now) == 1_732_896_000.0
    assert parse_time("now", now) == now
    assert parse_time("-15m", now) == now - 900
    assert parse_time("now-2h", now) == now - 7200
    with pytest.raises(ValueError, match="not a time: 'yesterday'"):
        parse_time("yesterday", now)
    with pytest.raises(ValueError, match="without a zone"):
        parse_time("2024-11-29T16:00:00", now)


def test_substitution_uses_grafanas_intervals_and_match_all() -> None:
    span = time_range(1000.0, 1600.0, scrape_interval=1.0)
    assert span.step == 2.0  # 600 s over 400 points, whole seconds
    expr = 'rate(x{job=~"$job", pod=~"${pod}"}[$__rate_interval]) + y[$__range]'
    assert substitute(expr, ["job", "pod"], span) == 'rate(x{job=~".*", pod=~".*"}[4s]) + y[600s]'
    slow = time_range(0.0, 60.0, scrape_interval=15.0)
    assert substitute("[$__rate_interval] [$__interval]", [], slow) == "[60s] [15s]"
    with pytest.raises(ValueError, match=r"unknown Grafana variable \$cluster"):
        substitute('x{cluster="$cluster"}', ["job"], span)
    with pytest.raises(ValueError, match="range is empty"):
        time_range(10.0, 10.0, 1.0)


def test_values_are_labelled_in_the_panels_unit() -> None:
    assert format_value(0.0123, "s") == "12.3 ms"
    assert format_value(2.5e-5, "s") == "25 µs"
    assert format_value(0.0, "s") == "0 s"
    assert format_value(0.953, "percentunit") == "95.3%"
    assert format_value(3 * 1024**3, "bytes") == "3 GiB"
    assert format_value(2.0e10, "Bps") == "20 GB/s"
    assert format_value(4096.0, "suffix: tokens") == "4,096 tokens"
    assert format_value(2.5e6, "suffix: tok/s") == "2.5M tok/s"
    assert format_value(1.5, "short") == "1.5"
    assert math.isnan(float(format_value(math.nan, "s")))


def test_annotation_regions_are_runs_of_samples() -> None:
    phase = Series("spec", {}, (0.0, 15.0, 30.0, 90.0, 105.0, 120.0), (1, 1, 1, 1, 1, math.nan))
    other = Series("flood", {}, (45.0, 60.0), (1.0, 1.0))
    assert regions([phase, other], step=15.0) == [
        Region(0.0, 30.0, "spec"),
        Region(45.0, 60.0, "flood"),
        Region(90.0, 105.0, "spec"),
    ]


def test_lines_break_where_steps_are_missing() -> None:
    series = Series("x", {}, (0.0, 15.0, 60.0, 75.0), (1.0, 2.0, 3.0, 4.0))
    times, values = with_gaps(series, step=15.0)
    assert times == [0.0, 15.0, 30.0, 60.0, 75.0]
    assert values[:2] == [1.0, 2.0] and math.isnan(values[2]) and values[3:] == [3.0, 4.0]


def test_legends_follow_grafanas_format() -> None:
    labels = {"__name__": "x", "model_name": "tiny", "engine": "0", "instance": "h:1"}
    assert legend("{{model_name}} engine {{engine}} ({{instance}})", labels) == (
        "tiny engine 0 (h:1)"
    )
    assert legend("{{model_name}} ({{job}})", labels) == "tiny"  # absent label: empty
    assert legend("", labels) == 'x{engine="0", instance="h:1", model_name="tiny"}'


def test_stacked_bars_group_instant_values_by_two_labels_as_grafana_does() -> None:
    board = next(b for b in BOARDS if b["uid"] == "glassbox-overview")
    [panel] = [p for p in _panels(board) if p["type"] == "barchart"]
    stage_series = [
        Series("", {"start": start, "stage": stage}, (0.0,), (value,))
        for start, stage, value in [
            ("11-30 03:41:34", "weights_load", 0.8),
            ("11-30 03:41:34", "compile", 28.9),
            ("11-29 16:19:12", "weights_load", 0.04),
            ("11-29 16:19:12", "engine_init", 120.6),
        ]
    ]
    data = PanelData("glassbox-overview", panel, (TargetData("A", "x", tuple(stage_series)),))
    bars, stacks, cells = stacked_bar_cells(data)
    assert bars == ["11-29 16:19:12", "11-30 03:41:34"]
    assert stacks == ["weights_load", "compile", "engine_init"]
    assert cells[("11-30 03:41:34", "compile")] == 28.9
    assert ("11-29 16:19:12", "compile") not in cells  # absent, drawn as nothing


# --- snapshot: against a real Prometheus holding known data -------------------------------

KNOWN_END = time.time() - 3600  # backfilled blocks must not overlap Prometheus' head
KNOWN_START = KNOWN_END - 1800


def _openmetrics() -> str:
    """30 minutes of an exporter and a vLLM, every 15 s, as OpenMetrics for backfilling."""
    vllm_labels = 'job="vllm",instance="127.0.0.1:8000",model_name="tiny",engine="0"'
    families: dict[str, list[str]] = {
        "glassbox_scrape_duration_seconds gauge": [],
        "glassbox_target_up gauge": [],
        "vllm:kv_cache_usage_perc gauge": [],
        "vllm:num_preemptions counter": [],
        "glassbox_lab_phase_info gauge": [],
    }
    t = KNOWN_START
    i = 0
    while t <= KNOWN_END:
        exporter = 'job="glassbox",instance="127.0.0.1:9400"'
        families["glassbox_scrape_duration_seconds gauge"].append(
            f"glassbox_scrape_duration_seconds{{{exporter}}} 0.004 {t:.3f}"
        )
        families["glassbox_target_up gauge"].append(f"glassbox_target_up{{{exporter}}} 1 {t:.3f}")
        families["vllm:kv_cache_usage_perc gauge"].append(
            f"vllm:kv_cache_usage_perc{{{vllm_labels}}} {min(i / 100, 1.0)} {t:.3f}"
        )
        families["vllm:num_preemptions counter"].append(
            f"vllm:num_preemptions_total{{{vllm_labels}}} {i // 10} {t:.3f}"
        )
        if 20 <= i < 60:  # a lab phase from minute 5 to minute 15
            phase = 'job="lab",phase="pool",kind="kv-pressure",variant=""'
            families["glassbox_lab_phase_info gauge"].append(
                f"glassbox_lab_phase_info{{{phase}}} 1 {t:.3f}"
            )
        t += 15
        i += 1
    text = []
    for header, samples in families.items():
        name, kind = header.split()
        text += [f"# TYPE {name} {kind}", *samples]
    return "\n".join([*text, "# EOF", ""])


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Prometheus whose only data is `_openmetrics()` (backfilled with promtool)."""
    assert shutil.which("prometheus"), "Debian's prometheus is not installed (scripts/setup.sh)"
    work = tmp_path_factory.mktemp("prometheus")
    source = work / "data.om"
    source.write_text(_openmetrics())
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(source), str(work / "tsdb")],
        check=True,
        capture_output=True,
    )
    config = {"global": {"scrape_interval": "15s"}}
    with PrometheusProcess(work, config) as prometheus:
        yield prometheus.url


@pytest.mark.prometheus
def test_snapshot_draws_every_panel_and_names_the_empty_ones(
    prometheus: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "snapshot",
            "--prometheus",
            prometheus,
            "--out",
            str(tmp_path),
            "--from",
            str(KNOWN_START),
            "--to",
            str(KNOWN_END),
        ]
    )
    assert code == 0
    err = capsys.readouterr().err
    assert "no data: glassbox-spec-decode / Draft acceptance ratio" in err
    assert "no data: glassbox-decode / Tokens per engine step" in err
    assert "Exporter: poll duration" not in err  # backfilled, so they have data
    assert "Lab phase" not in err
    assert "glassbox-kv-cache / KV cache usage\n" not in err

    panels = sum(len(_panels(b)) for b in BOARDS)
    pngs = sorted(tmp_path.rglob("*.png"))
    assert len(pngs) == panels + len(BOARDS)
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert (tmp_path / "glassbox-overview.png").stat().st_size > 50_000
    index = (tmp_path / "index.md").read_text()
    assert "- [Lab phase](glassbox-overview/01-lab-phase.png): data" in index
    assert "- [TPOT](glassbox-overview/02-tpot.png): **no data**" in index


@pytest.mark.prometheus
def test_snapshot_values_are_prometheus_values(prometheus: str, tmp_path: Path) -> None:
    client = Prometheus(prometheus)
    try:
        shot = draw_pictures(client, tmp_path, KNOWN_START, KNOWN_END, BOARDS[:1])
    finally:
        client.close()
    usage = next(p for p in shot.panels if p.title == "KV cache usage")
    (series,) = usage.targets[0].series
    assert series.legend == "tiny engine 0 (127.0.0.1:8000)"
    assert series.last == 1.0  # the backfilled gauge ends at 1.0
    preemptions = next(p for p in shot.panels if p.title == "Preemptions per second")
    (rate,) = preemptions.targets[0].series
    # One preemption every 10 samples of 15 s: on average rate() sees 1/150 per second.
    values = [v for v in rate.values if math.isfinite(v)]
    assert sum(values) / len(values) == pytest.approx(1 / 150, rel=0.15)
    (phase,) = next(p for p in shot.panels if p.title == "Lab phase").targets[0].series
    assert phase.legend == "kv-pressure: pool"
    assert phase.times[0] == pytest.approx(KNOWN_START + 20 * 15, abs=15)
    assert {p.title for p in shot.empty} >= {"TPOT", "Draft acceptance"}
    client = Prometheus(prometheus)
    try:
        span = time_range(KNOWN_START, KNOWN_END, client.scrape_interval())
        (region,) = query_annotations(BOARDS[0], client, span)
    finally:
        client.close()
    assert region.text == "pool"  # the annotation's titleFormat: {{phase}}
    assert region.start == pytest.approx(KNOWN_START + 20 * 15, abs=span.step)
    # Backfilled samples carry no staleness marker (a scrape would write one), so
    # Prometheus' 5-minute lookback carries the last one on.
    assert region.end == pytest.approx(KNOWN_START + 59 * 15 + 300, abs=span.step)


@pytest.mark.prometheus
def test_snapshot_reports_queries_prometheus_rejects(prometheus: str, tmp_path: Path) -> None:
    board = json.loads(json.dumps(BOARDS[1]))
    broken = _panels(board)[1]
    broken["targets"][0]["expr"] = "rate(glassbox_target_up)"
    client = Prometheus(prometheus)
    try:
        shot = draw_pictures(client, tmp_path, KNOWN_START, KNOWN_END, [board])
    finally:
        client.close()
    (failed,) = shot.failed
    assert failed.title == broken["title"]
    assert "A: bad_data" in failed.errors[0] and "range vector" in failed.errors[0]


def test_snapshot_names_an_unreachable_prometheus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["snapshot", "--prometheus", url, "--out", str(tmp_path)]) == 2
    assert f"cannot reach Prometheus at {url}" in capsys.readouterr().err


def test_snapshot_rejects_a_time_it_cannot_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["snapshot", "--prometheus", "http://127.0.0.1:1", "--out", str(tmp_path)]
    assert main([*args, "--from", "yesterday"]) == 2
    assert "not a time: 'yesterday'" in capsys.readouterr().err
    assert main([*args, "--from=-5m", "--to=now-10m"]) == 2
    assert "range is empty" in capsys.readouterr().err
