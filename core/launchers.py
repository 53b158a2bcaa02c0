"""vLLM's families as launchers pass them on: under another prefix, beside other servers'.

Ray Serve LLM records vLLM's metrics through Ray (vLLM's RayPrometheusStatLogger,
vllm/v1/metrics/ray_wrappers.py), whose exporter puts `ray_` before each name; earlier
releases kept the colon (`ray_vllm:`, ray-project/ray#51156), later ones write names
OpenTelemetry takes (every character but letters, digits and `_` made `_`: `ray_vllm_`).
Each series gets a `ReplicaId` label (the Serve replica), and Ray's own `WorkerId`; a
node's page holds every replica on that node. Dynamo's workers and llm-d's routing
sidecar keep vLLM's names (docs/compatibility.md). Which prefix a page has is read from
the page when exactly one known prefix shows, or given (`--metric-prefix`); never
guessed.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping

from vllm_glassbox.core.errors import ScrapeError
from vllm_glassbox.core.textformat import Samples

VLLM_PREFIX = "vllm:"
KNOWN_PREFIXES = (VLLM_PREFIX, "ray_vllm:", "ray_vllm_")
#: A prefix argument meaning: whichever one of KNOWN_PREFIXES the page shows.
AUTO_PREFIX = "auto"
#: Labels that tell apart servers whose series share one page (Ray Serve's replicas).
REPLICA_LABELS = ("ReplicaId", "WorkerId")


@functools.lru_cache(maxsize=8)
def _prefixed(wanted: frozenset[str], prefixes: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in wanted:
        for prefix in prefixes:
            if name.startswith(VLLM_PREFIX):
                out[prefix + name[len(VLLM_PREFIX) :]] = name
            else:
                out[name] = name  # process_*: the page's own
    return out


def prefixed(wanted: frozenset[str], prefix: str) -> dict[str, str]:
    """Each wanted sample name under `prefix` (AUTO_PREFIX: under each known one) -> its
    name under vLLM's own prefix."""
    return _prefixed(wanted, KNOWN_PREFIXES if prefix == AUTO_PREFIX else (prefix,))


def under_one_prefix(samples: Samples, names: Mapping[str, str]) -> tuple[str, Samples]:
    """The prefix the page's vLLM samples have, and them under vLLM's own names; refused
    (no_vllm_metrics) where they come under two: which is the server's is not guessed."""
    shown = sorted({p for n in samples for p in KNOWN_PREFIXES if n.startswith(p)})
    if len(shown) > 1:
        raise ScrapeError(
            "no_vllm_metrics",
            f"vLLM's series under {len(shown)} prefixes ({', '.join(shown)}): which are "
            "this server's is not guessed; give --metric-prefix",
        )
    return (shown[0] if shown else VLLM_PREFIX), {names[n]: series for n, series in samples.items()}


def check_one_replica(samples: Samples) -> None:
    """Refuse (duplicate_series) a page with the series of several servers for one engine,
    told apart only by a replica label: summed, they would read as one server's (a pool
    twice its size, a restart whenever one replica restarts)."""
    for name, series in samples.items():
        seen: dict[tuple[str, str], set[tuple[str, ...]]] = {}
        for labels in series:
            d = dict(labels)
            key = (d.get("model_name", ""), d.get("engine", "0"))
            seen.setdefault(key, set()).add(_replica(d, REPLICA_LABELS))
        for (model, engine), replicas in seen.items():
            if len(replicas) > 1:
                raise ScrapeError(
                    "duplicate_series",
                    f"{name}: {len(replicas)} replicas' series for engine {engine!r} of "
                    f"{model!r} ({'/'.join(REPLICA_LABELS)} differ): a Ray node's page; "
                    "give each replica an exporter of its own",
                )


def _replica(labels: Mapping[str, str], names: Iterable[str]) -> tuple[str, ...]:
    return tuple(labels.get(n, "") for n in names)
