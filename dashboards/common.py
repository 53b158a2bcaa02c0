"""What every glassbox dashboard shares: data source, variables, selectors, panel shapes.

Selectors live here and only here, so re-targeting the dashboards (another label for the
namespace, say) is one edit. Three scopes, as in vLLM's own dashboards:

- ``TARGET``: where a scrape came from. Series without `model_name` (the exporter's facts
  about weights and hardware, `vllm:cache_config_info`) take only this one.
- ``MODEL``: ``TARGET`` plus the served model.
- ``ENGINE``: ``MODEL`` plus vLLM's engine index (the data-parallel rank).
- ``RULE``: the fleet recording rules, aggregated `by (namespace, job, model_name)`
  (and `cluster` where the rules keep it: `glassbox rules --aggregation-labels`).

Every variable is multi-valued with an "All" whose value is `.*`, which also matches a
series that lacks the label (no `cluster` on a single cluster's Prometheus, no
`namespace` or `pod` outside Kubernetes). vLLM and its exporter are two scrape targets:
in Kubernetes they share `namespace`, `pod` and (with one ServiceMonitor or PodMonitor)
`job`; elsewhere pick both jobs. Every dashboard links to the others with the time range
and the variables kept (Grafana's dashboard links, by the tag "glassbox").
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass

from grafanalib.core import (
    REFRESH_ON_TIME_RANGE_CHANGE,
    SORT_ALPHA_ASC,
    Annotations,
    BarChart,
    Dashboard,
    DashboardLink,
    GridPos,
    Panel,
    RowPanel,
    Stat,
    Table,
    Target,
    Template,
    Templating,
    Time,
    TimeSeries,
)

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

PLACE = 'cluster=~"$cluster", namespace=~"$namespace"'
TARGET = PLACE + ', job=~"$job", pod=~"$pod"'
MODEL = TARGET + ', model_name=~"$model_name"'
ENGINE = MODEL + ', engine=~"$engine"'
RULE = PLACE + ', job=~"$job", model_name=~"$model_name"'
# Records per namespace and model whatever the job (replicas needed, the start baseline).
NAMESPACE_RULE = PLACE + ', model_name=~"$model_name"'
TAG = "glassbox"  # every dashboard's, and what their links list

# Tag the lab puts on the annotations it posts through Grafana's HTTP API.
LAB_ANNOTATION_TAG = "glassbox-lab"

# Grafana schema the JSON is written for (Grafana 9.x and later read it without migrating).
SCHEMA_VERSION = 37

# Series that name the scrape targets: vLLM's and the exporter's, so the variables list
# the jobs, namespaces and pods of both.
_TARGETS = '{__name__=~"vllm:num_requests_running|glassbox_target_up"'


def _variable(name: str, label: str, query: str) -> Template:
    variable = Template(
        name=name,
        label=label,
        query=query,
        dataSource=DATASOURCE,
        includeAll=True,
        multi=True,
        allValue=".*",
        refresh=REFRESH_ON_TIME_RANGE_CHANGE,
        sort=SORT_ALPHA_ASC,
    )
    # Start on "All", written as Grafana writes a multi-value selection.
    variable._current = {"selected": True, "text": ["All"], "value": ["$__all"]}
    return variable


def variables() -> list[Template]:
    """datasource, cluster, namespace, job, pod, model_name, engine: each narrows the
    next."""
    return [
        Template(
            name="datasource",
            label="Data source",
            query="prometheus",
            type="datasource",
        ),
        _variable("cluster", "Cluster", f"label_values({_TARGETS}}}, cluster)"),
        _variable(
            "namespace",
            "Namespace",
            f'label_values({_TARGETS}, cluster=~"$cluster"}}, namespace)',
        ),
        _variable("job", "Job", f"label_values({_TARGETS}, {PLACE}}}, job)"),
        _variable("pod", "Pod", f'label_values({_TARGETS}, {PLACE}, job=~"$job"}}, pod)'),
        _variable(
            "model_name",
            "Model",
            f"label_values(vllm:num_requests_running{{{TARGET}}}, model_name)",
        ),
        _variable(
            "engine", "Engine", f"label_values(vllm:num_requests_running{{{MODEL}}}, engine)"
        ),
    ]


LAB_PHASES = f"max by (kind, phase, variant) (glassbox_lab_phase_info{{{PLACE}}})"


def dashboard_annotations() -> Annotations:
    """Grafana's own annotations and alerts, plus the lab's phases from two sources.

    The lab serves `glassbox_lab_phase_info` while a phase runs (a region per phase) and,
    when given a Grafana URL and token, also posts annotations tagged LAB_ANNOTATION_TAG.
    """
    return Annotations(
        list=[
            {
                "builtIn": 1,
                "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                "enable": True,
                "hide": True,
                "iconColor": "rgba(0, 211, 255, 1)",
                "name": "Annotations & Alerts",
                "type": "dashboard",
            },
            {
                "datasource": DATASOURCE,
                "enable": True,
                "expr": LAB_PHASES,
                "iconColor": "#FF9830",
                "name": "Lab phases",
                "step": "5s",
                "tagKeys": "kind,variant",
                "textFormat": "{{kind}} {{variant}}",
                "titleFormat": "{{phase}}",
                "useValueForTime": False,
            },
            {
                "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                "enable": True,
                "iconColor": "#B877D9",
                "name": "Lab annotations",
                "target": {
                    "limit": 100,
                    "matchAny": True,
                    "tags": [LAB_ANNOTATION_TAG],
                    "type": "tags",
                },
            },
        ]
    )


# --- targets and panels -------------------------------------------------------------------


@dataclass(frozen=True)
class Q:
    """One query of a panel: PromQL and the legend of its series."""

    expr: str
    legend: str = ""
    instant: bool = False
    dashed: bool = False  # fleet lines, so they stay apart from the per-engine ones


def _targets(queries: Sequence[Q], table: bool = False) -> list[Target]:
    return [
        Target(
            expr=q.expr,
            legendFormat=q.legend,
            refId=string.ascii_uppercase[i],
            instant=q.instant,
            format="table" if table else "time_series",
            intervalFactor=1,
            datasource=DATASOURCE,
        )
        for i, q in enumerate(queries)
    ]


def _steps(thresholds: Sequence[tuple[str, float | None]]) -> list[dict[str, object]]:
    """Grafana threshold steps; the first one has no lower bound (value None)."""
    return [{"color": color, "value": value} for color, value in thresholds]


def timeseries(
    title: str,
    description: str,
    queries: Sequence[Q],
    unit: str,
    *,
    thresholds: Sequence[tuple[str, float | None]] = (),
    min_zero: bool = True,
    band: bool = False,
    mappings: Sequence[dict[str, object]] = (),
) -> TimeSeries:
    """A time series panel. `thresholds` are drawn as dashed lines: only for judgements.

    `band` draws a filled step (for 0/1 series such as a running phase).
    """
    targets = _targets(queries)
    return TimeSeries(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        maxDataPoints=None,  # Grafana picks the resolution from the panel width
        targets=targets,
        unit=unit,
        valueMin=0 if min_zero else None,
        legendDisplayMode="list",
        legendPlacement="bottom",
        tooltipMode="multi",
        lineWidth=1 if band else 2,
        fillOpacity=60 if band else 0,
        lineInterpolation="stepAfter" if band else "linear",
        showPoints="never",
        spanNulls=False,
        mappings=list(mappings),
        overrides=[
            _DASHED | {"matcher": {"id": "byFrameRefID", "options": t.refId}}
            for t, query in zip(targets, queries, strict=True)
            if query.dashed
        ],
        thresholds=_steps(thresholds),
        thresholdsStyleMode="dashed" if thresholds else "off",
    )


_DASHED: dict[str, object] = {
    "properties": [{"id": "custom.lineStyle", "value": {"dash": [10, 10], "fill": "dash"}}]
}


def stat(
    title: str,
    description: str,
    queries: Sequence[Q],
    unit: str,
    *,
    thresholds: Sequence[tuple[str, float | None]] = (),
    mappings: Sequence[dict[str, object]] = (),
    text_mode: str = "auto",
) -> Stat:
    """The latest value of each series (a number with a sparkline)."""
    return Stat(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        maxDataPoints=None,  # Grafana picks the resolution from the panel width
        targets=_targets(queries),
        format=unit,
        reduceCalc="lastNotNull",
        graphMode="area",
        colorMode="value",
        textMode=text_mode,
        mappings=list(mappings),
        noValue="no data",
        thresholds=_steps(thresholds or [("text", None)]),
    )


def table(title: str, description: str, queries: Sequence[Q], columns: Sequence[str]) -> Table:
    """Instant values with their labels; only `columns` (label names, or Value) are shown."""
    return Table(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        maxDataPoints=None,  # Grafana picks the resolution from the panel width
        targets=_targets([Q(q.expr, q.legend, instant=True) for q in queries], table=True),
        transformations=[
            {"id": "filterFieldsByName", "options": {"include": {"names": list(columns)}}}
        ],
    )


def stacked_bars(
    title: str, description: str, query: Q, unit: str, *, bar: str, stack: str
) -> BarChart:
    """One bar per value of the label `bar`, stacked by the label `stack`: the query's
    instant values, turned into a matrix by Grafana's "grouping to matrix"."""
    return BarChart(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        maxDataPoints=None,
        targets=_targets([Q(query.expr, query.legend, instant=True)], table=True),
        transformations=[
            {
                "id": "groupingToMatrix",
                "options": {"columnField": stack, "rowField": bar, "valueField": "Value"},
            }
        ],
        stacking="normal",
        showValue="never",
        xTickLabelRotation=-30,
        legendPlacement="right",
        thresholdSteps=[{"color": "text", "value": None}],  # no judgement in a bar's colour
        extraJson={"fieldConfig": {"defaults": {"unit": unit}}},
    )


STATE_MAPPINGS: list[dict[str, object]] = [
    {
        "type": "value",
        "options": {
            "0": {"index": 0, "text": "inactive", "color": "green"},
            "1": {"index": 1, "text": "pending", "color": "orange"},
            "2": {"index": 2, "text": "firing", "color": "red"},
        },
    }
]
"""Alert state encoded as a number: 0 inactive, 1 pending, 2 firing."""


# --- layout -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """A titled row of panels; each entry is (panel, width in 1/24 of the screen)."""

    title: str
    panels: Sequence[tuple[Panel, int]]
    height: int = 8


def layout(rows: Sequence[Row]) -> list[Panel]:
    """Place rows top to bottom; a row's panels wrap to the next line past 24 columns."""
    placed: list[Panel] = []
    y = 0
    for row in rows:
        placed.append(RowPanel(title=row.title, gridPos=GridPos(h=1, w=24, x=0, y=y)))
        y += 1
        x = 0
        for panel, width in row.panels:
            if x + width > 24:
                x, y = 0, y + row.height
            panel.gridPos = GridPos(h=row.height, w=width, x=x, y=y)
            placed.append(panel)
            x += width
        y += row.height
    return placed


def dashboard(uid: str, title: str, description: str, rows: Sequence[Row]) -> Dashboard:
    return Dashboard(
        uid=uid,
        title=title,
        description=description,
        tags=["vllm", TAG],
        timezone="browser",
        refresh="30s",
        time=Time("now-1h", "now"),
        graphTooltip=1,  # shared crosshair: the same moment on every panel
        schemaVersion=SCHEMA_VERSION,
        templating=Templating(list=variables()),
        annotations=dashboard_annotations(),
        panels=layout(rows),
        links=[
            DashboardLink(
                title="glassbox",
                type="dashboards",
                tags=[TAG],
                asDropdown=False,
                includeVars=True,  # the cluster, namespace, model, ... picked here
                keepTime=True,
            )
        ],
    ).auto_panel_ids()


ENGINE_LEGEND = "{{model_name}} engine {{engine}} ({{instance}})"
FLEET_LEGEND = "{{model_name}} fleet, 5m ({{namespace}}, {{job}})"

# Grafana unit ids (custom units are "suffix:<text>").
SECONDS = "s"
RATIO = "percentunit"
NUMBER = "short"
BYTES = "bytes"
BYTES_PER_SECOND = "Bps"
TOKENS = "suffix: tokens"
TOKENS_PER_SECOND = "suffix: tok/s"
PER_SECOND = "suffix: /s"

UP_MAPPINGS: list[dict[str, object]] = [
    {
        "type": "value",
        "options": {
            "0": {"index": 0, "text": "down", "color": "red"},
            "1": {"index": 1, "text": "up", "color": "green"},
        },
    }
]
