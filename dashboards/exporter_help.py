"""The HELP text of every series the exporter publishes, from the exporter's catalogue.

Panel descriptions quote these rather than restating formulas (`core/series.py`
declares each family once). When a formula changes there, the dashboards' descriptions
follow on the next `glassbox dashboards generate`.
"""

from __future__ import annotations

from vllm_glassbox.core.series import BY_NAME


def help_of(name: str) -> str:
    """HELP text of one exported series, without the window's length (a flag sets it); a
    name the exporter does not publish is a bug."""
    if name not in BY_NAME:
        raise KeyError(f"the exporter publishes no series named {name!r}")
    return BY_NAME[name].help


def per_engine(name: str) -> str:
    """Description of an exporter series shown per engine."""
    return f"Per engine, over the exporter's window (--window, default 60 s). {help_of(name)}"


def fleet(record: str) -> str:
    """Description of a fleet recording rule that mirrors an exporter ratio."""
    return (
        f"Fleet line: recording rule {record}, the same formula from 5-minute rates of "
        "vLLM's counters, summed over the engines of a job and model before dividing."
    )
