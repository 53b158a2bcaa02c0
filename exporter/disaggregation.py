"""The page's families of disaggregated serving and adapters, from one poll's state.

What each family is lives in `core/series_disagg.py`; the numbers come from the
derivation core (`core/derive/disaggregation.py`). The role is the log's word where it
states `--kv-transfer-config`, else the page's (`disagg_page.server_role`).
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from vllm_glassbox.core import derive
from vllm_glassbox.core import disagg_page as kv
from vllm_glassbox.core import series_disagg as families
from vllm_glassbox.core.derive import Increase
from vllm_glassbox.core.snapshot import EngineKey, Snapshot


def role_of(snapshot: Snapshot, logged: kv.KvRole | None, version: str | None) -> kv.KvRole:
    """This server's KV role, from the log or the page."""
    consumer = any(kv.consumer_engines(e.gauges) for e in snapshot.engines.values())
    return kv.server_role(
        logged, consumer, list(snapshot.kv_connectors), kv.shows_fetch_stages(version)
    )


def disaggregation_families(
    snapshot: Snapshot,
    increases: Mapping[EngineKey, Increase],
    role: kv.KvRole,
    window_seconds: float,
    link_peak: float | None,
) -> list[Metric]:
    """The role, the prompt tokens' sources and the transfers of each engine."""
    models = sorted({key.model_name for key in snapshot.engines}) or [""]
    info = families.ROLE_INFO.new()
    for model in models:
        info.add_metric([model, role.role, role.connector, role.source], 1.0)
    shares = families.SOURCE_SHARE.new(window_seconds)
    prefill = families.CONSUMER_PREFILL.new(window_seconds)
    transfers = [(series, series.new(window_seconds)) for series in families.TRANSFERS]
    for key, d in sorted(increases.items()):
        labels = [key.model_name, key.engine]
        for source, share in derive.prompt_token_source_shares(d).items():
            shares.add_metric([*labels, source], share)
        if kv.is_consumer(role):
            _add(prefill, labels, families.CONSUMER_PREFILL.compute(d, link_peak))
        for series, family in transfers:
            _add(family, labels, series.compute(d, link_peak))
    link = families.LINK_BANDWIDTH.new()
    _add(link, [], link_peak)
    return [info, link, shares, prefill, *(family for _, family in transfers)]


def adapter_families(snapshot: Snapshot) -> list[Metric]:
    """How many adapters have requests in flight, the adapter budget, and the deferred
    share of the waits of each engine."""
    adapters, budget = families.ADAPTERS.new(), families.ADAPTER_BUDGET.new()
    model = next(iter(snapshot.engines)).model_name if snapshot.engines else ""
    if snapshot.adapters is not None:
        adapters.add_metric([model], float(len(snapshot.adapters.active)))
        _add(budget, [model], snapshot.adapters.max_loras)
    deferred = families.DEFERRED_SHARE.new()
    for key, sample in sorted(snapshot.engines.items()):
        if kv.WAITING_FOR + "deferred" not in sample.gauges:
            continue
        # The reasons sum to vLLM's num_requests_waiting.
        waiting = sum(v for n, v in sample.gauges.items() if n.startswith(kv.WAITING_FOR))
        deferred_now = sample.gauges[kv.WAITING_FOR + "deferred"]
        _add(
            deferred,
            [key.model_name, key.engine],
            derive.deferred_share_of_waiting(deferred_now, waiting),
        )
    return [adapters, budget, deferred]


def _add(
    family: GaugeMetricFamily | CounterMetricFamily, labels: list[str], value: float | None
) -> None:
    """A series whose value is unknown is absent: never 0, never NaN."""
    if value is not None:
        family.add_metric(labels, value)
