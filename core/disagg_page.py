"""What vLLM's page says of disaggregated serving and of adapters, in glassbox's names.

The names of vLLM's families are known here, beside `snapshot.py` (which reads them
with everything else): where prompt tokens came from (`vllm:prompt_tokens_by_source_total`,
0.16+), the KV connectors' transfer families (NIXL 0.11.1+, Mooncake 0.33+), the
consumer's fetch stages (`vllm:num_requests_kv_fetch_by_stage`, 0.32+, only on a KV
consumer), waits by reason (0.20+) and the adapters (`vllm:lora_requests_info`, with
`--enable-lora`). What a server's KV role is comes from here too: from the page, and from
vLLM's log where it states `kv_transfer_config` (`startup_log.py`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_glassbox.core.textformat import Labels, Samples

if TYPE_CHECKING:  # the snapshot reads its pages with this module
    from vllm_glassbox.core.snapshot import EngineKey

# Canonical names, per engine (counters cumulative).
PROMPT_FROM = "prompt_tokens_from/"  # + source: "prompt_tokens_from/local_compute", ...
SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
KV_TRANSFER_SECONDS = "kv_transfer_seconds_sum"  # time spent in transfers that succeeded
KV_TRANSFERS = "kv_transfers"  # transfers that succeeded
KV_TRANSFER_BYTES = "kv_transfer_bytes_sum"
KV_TRANSFER_FAILURES = "kv_transfer_failures"
KV_TRANSFER_EXPIRED = "kv_transfer_expired"  # requests whose KV expired before a fetch
# Gauges, per engine.
KV_FETCH = "kv_fetch/"  # + stage: waiting_to_start, in_progress, completed_waiting
FETCH_STAGES = ("waiting_to_start", "in_progress", "completed_waiting")
WAITING_FOR = "waiting_for/"  # + reason: capacity, deferred (LoRA budget, KV transfer)

#: Each connector's transfer families: canonical name -> vLLM's sample names, summed where
#: several count the same thing (Mooncake's failed sends and failed receives).
CONNECTORS: dict[str, dict[str, tuple[str, ...]]] = {
    # vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py (0.20+; nixl_connector.py
    # before): failed transfers include failed handshakes and notifications.
    "nixl": {
        KV_TRANSFER_SECONDS: ("vllm:nixl_xfer_time_seconds_sum",),
        KV_TRANSFERS: ("vllm:nixl_xfer_time_seconds_count",),
        KV_TRANSFER_BYTES: ("vllm:nixl_bytes_transferred_sum",),
        KV_TRANSFER_FAILURES: ("vllm:nixl_num_failed_transfers_total",),
        KV_TRANSFER_EXPIRED: ("vllm:nixl_num_kv_expired_reqs_total",),
    },
    # vllm/distributed/kv_transfer/kv_connector/v1/mooncake/stats.py (0.33+).
    "mooncake": {
        KV_TRANSFER_SECONDS: ("vllm:mooncake_xfer_time_seconds_sum",),
        KV_TRANSFERS: ("vllm:mooncake_xfer_time_seconds_count",),
        KV_TRANSFER_BYTES: ("vllm:mooncake_bytes_transferred_sum",),
        KV_TRANSFER_FAILURES: (
            "vllm:mooncake_num_failed_transfers_total",
            "vllm:mooncake_num_failed_recvs_total",
        ),
        KV_TRANSFER_EXPIRED: ("vllm:mooncake_num_kv_expired_reqs_total",),
    },
}
#: Transfer families glassbox recognises and does not read as a P/D transfer: on a page
#: without the families above, they are a shape glassbox flags (the transfer series absent,
#: never guessed from them).
FOREIGN_NAMES: dict[str, tuple[str, ...]] = {
    # MooncakeStoreConnector (0.22+): loads and puts to a shared store, by operation and
    # status, not transfers between a producer and a consumer
    # (kv_connector/v1/mooncake/store/metrics.py).
    "mooncake_store": (
        "vllm:mooncake_store_operation_bytes_total",
        "vllm:mooncake_store_operation_time_seconds_sum",
    ),
}

_BY_SOURCE = "vllm:prompt_tokens_by_source_total"
_FETCH_BY_STAGE = "vllm:num_requests_kv_fetch_by_stage"
_WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
_LORA = "vllm:lora_requests_info"

#: Labelled families read per label value: sample name -> (label, canonical prefix).
LABELLED_COUNTERS: dict[str, tuple[str, str]] = {_BY_SOURCE: ("source", PROMPT_FROM)}
LABELLED_GAUGES: dict[str, tuple[str, str]] = {
    _FETCH_BY_STAGE: ("stage", KV_FETCH),
    _WAITING_BY_REASON: ("reason", WAITING_FOR),
}

WANTED: frozenset[str] = frozenset(
    [n for by_name in CONNECTORS.values() for names in by_name.values() for n in names]
    + [n for names in FOREIGN_NAMES.values() for n in names]
    + [*LABELLED_COUNTERS, *LABELLED_GAUGES, _LORA]
)


def connector_counters(samples: Samples) -> tuple[dict[str, dict[Labels, float]], list[str]]:
    """The transfer counters of every connector on the page, summed per canonical name and
    series (a MultiConnector's connectors add up), and the connectors found."""
    out: dict[str, dict[Labels, float]] = {}
    found: list[str] = []
    for connector, by_name in CONNECTORS.items():
        present = False
        for canonical, names in by_name.items():
            for name in names:
                for labels, value in samples.get(name, {}).items():
                    series = out.setdefault(canonical, {})
                    series[labels] = series.get(labels, 0.0) + value
                    present = True
        if present:
            found.append(connector)
    return out, found


def foreign_connector_names(samples: Samples) -> list[str]:
    """The transfer families of FOREIGN_NAMES on the page."""
    return sorted(name for names in FOREIGN_NAMES.values() for name in names if name in samples)


@dataclass(frozen=True)
class Adapters:
    """`vllm:lora_requests_info`'s latest series: the adapter budget (`--max-loras`) and the
    adapters with requests in flight.

    Its two labels cannot be told apart on every release: vLLM 0.32's front end keeps
    every adapter with a request in flight in both `running_lora_adapters` and
    `waiting_lora_adapters`, its count of 0 included (`LoRARequestStates` in
    vllm/v1/metrics/stats.py; the logger joins the keys), where older releases named an
    adapter only where it had requests. Their union is what every release says alike;
    how many requests wait for the budget is `num_requests_waiting_by_reason{deferred}`."""

    max_loras: int | None
    active: tuple[str, ...]


def _names(joined: str) -> list[str]:
    return [name for name in joined.split(",") if name]


def adapters_of(samples: Samples) -> Adapters | None:
    """vLLM sets the gauge to the time of each update, on a series of that update's
    adapters; the series of earlier updates stay on the page with older times. The newest
    is the state; None without `--enable-lora` or before its first update."""
    series = samples.get(_LORA)
    if not series:
        return None
    labels, _ = max(series.items(), key=lambda item: item[1] if math.isfinite(item[1]) else -1)
    d = dict(labels)
    raw = d.get("max_lora", "")
    named = _names(d.get("running_lora_adapters", "")) + _names(d.get("waiting_lora_adapters", ""))
    return Adapters(
        max_loras=int(raw) if raw.isdigit() else None, active=tuple(dict.fromkeys(named))
    )


# --- the role of a server ---------------------------------------------------------------

ROLES = ("producer", "consumer", "both", "none", "unknown")
_LOG_ROLES = {"kv_producer": "producer", "kv_consumer": "consumer", "kv_both": "both"}
_KV_CONFIG = re.compile(
    r"KVTransferConfig\((?=[^)]*kv_connector='(?P<connector>[^']+)')"
    r"(?=[^)]*kv_role='(?P<role>[^']+)')"
)
_KV_CONFIG_DICT = re.compile(
    r"'kv_transfer_config': \{(?=[^}]*'kv_connector': '(?P<connector>[^']+)')"
    r"(?=[^}]*'kv_role': '(?P<role>[^']+)')"
)


@dataclass(frozen=True)
class KvRole:
    """A server's KV role (producer: it prefills for others; consumer: it receives KV;
    both; none: no connector; unknown: a connector, its side not said), the connector
    where one is named, and where glassbox read it: log or page."""

    role: str
    connector: str
    source: str


def role_in_log(line: str) -> KvRole | None:
    """The role a log line states: vLLM's "non-default args: {...}" line names the
    `kv_transfer_config` it was started with (a `KVTransferConfig(...)`, or the dict of
    `--kv-transfer-config` in some releases)."""
    m = _KV_CONFIG.search(line) or _KV_CONFIG_DICT.search(line)
    if m is None:
        return None
    role = _LOG_ROLES.get(m.group("role"), "unknown")
    return KvRole(role, m.group("connector"), "log")


def role_on_page(consumer_gauges: bool, connectors: list[str], fetch_stages_exist: bool) -> KvRole:
    """The role the page shows: the fetch stages exist only on a KV consumer (a `kv_both`
    server is one too); a connector's families without them are a producer's where vLLM
    shows the stages (0.32+, `fetch_stages_exist`), else unknown."""
    connector = "+".join(connectors)
    if consumer_gauges:
        return KvRole("consumer", connector, "page")
    if connectors:
        return KvRole("producer" if fetch_stages_exist else "unknown", connector, "page")
    return KvRole("none", "", "page")


def server_role(
    logged: KvRole | None, consumer_gauges: bool, connectors: list[str], fetch_stages_exist: bool
) -> KvRole:
    """The log's word where it has one (it tells producer from both), else the page's."""
    if logged is not None:
        return logged
    return role_on_page(consumer_gauges, connectors, fetch_stages_exist)


def is_consumer(role: KvRole) -> bool:
    return role.role in ("consumer", "both")


def labelled(
    samples: Samples, table: Mapping[str, tuple[str, str]]
) -> list[tuple[str, Labels, float]]:
    """(canonical name, the series' labels without the read label, value) of each series
    of the labelled families in `table`."""
    out: list[tuple[str, Labels, float]] = []
    for name, (label, prefix) in table.items():
        for labels, value in samples.get(name, {}).items():
            d = dict(labels)
            rest = tuple((k, v) for k, v in labels if k != label)
            out.append((prefix + d.get(label, ""), rest, value))
    return out


def shows_fetch_stages(version: str | None) -> bool:
    """Whether a release shows a consumer's fetch stages (vLLM 0.32+): there a connector's
    families without them are a producer's."""
    try:
        major, minor = (int(p) for p in (version or "").split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (0, 32)


def consumer_engines(gauges: Mapping[str, float]) -> bool:
    """Whether one engine's gauges hold a consumer's fetch stages."""
    return any(name.startswith(KV_FETCH) for name in gauges)


def transfer_shapes(
    samples: Samples, gauges: Mapping[EngineKey, Mapping[str, float]], connectors: list[str]
) -> dict[str, str]:
    """A consumer's page whose transfers glassbox cannot read: transfer families it does
    not read as such, or none at all (a connector that exports none: the shares of prompt
    tokens are read, the transfer series are absent)."""
    if connectors:
        return {}
    foreign = foreign_connector_names(samples)
    if foreign:
        return {
            "kv_transfer_families_not_read": "KV transfer families glassbox does not read "
            "as transfers between a producer and a consumer: " + _listed(foreign)
        }
    consumers = sorted(
        key.engine for key, values in gauges.items() if any(n.startswith(KV_FETCH) for n in values)
    )
    if consumers:
        return {
            "kv_consumer_without_transfer_families": "a KV consumer's page "
            "(vllm:num_requests_kv_fetch_by_stage) without any transfer family glassbox "
            "reads (NIXL's, Mooncake's): engines " + ", ".join(consumers)
        }
    return {}


def _listed(names: Iterable[str]) -> str:
    shown = sorted(names)
    more = f" and {len(shown) - 3} more" if len(shown) > 3 else ""
    return ", ".join(shown[:3]) + more
