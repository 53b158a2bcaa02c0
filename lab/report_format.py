"""The report's words and pictures: numbers, tables, errors and plot files, the same in
report.md's general sections and in each experiment's own (`lab/experiments/`).

Pure: values in, text or PNG bytes out.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from vllm_glassbox.core.units import GIB
from vllm_glassbox.lab.results import PhaseResult, Spread, Startup

T = TypeVar("T")


def num(value: float | None, digits: int = 3, scale: float = 1.0) -> str:
    if value is None:
        return "–"
    v = value * scale
    if v != 0 and abs(v) >= 10**digits:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}"


def integer(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}"


def percent(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "–"
    if signed:
        return f"{value:+.1%}" if abs(value) >= 0.0005 else "±0.0%"
    return f"{value:.0%}"


def ms(sp: Spread | None) -> str:
    """A median in ms with its extremes."""
    if sp is None:
        return "–"
    if sp.n == 1:
        return num(sp.median, scale=1000)
    return f"{num(sp.median, scale=1000)} ({num(sp.low, scale=1000)}–{num(sp.high, scale=1000)})"


def gbs(value: float | None) -> str:
    """Bytes per second as GB/s, or TB/s from 1,000 GB/s."""
    if value is None:
        return "–"
    if value >= 1e12:
        return f"{value / 1e12:.3g} TB/s"
    return f"{value / 1e9:.3g} GB/s"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return [*lines, ""]


@dataclass(frozen=True)
class Column(Generic[T]):
    """One column of a report table, declared once: its title, and its cell for one row."""

    title: str
    cell: Callable[[T], str]


def table_of(columns: Sequence[Column[T]], rows: Iterable[T]) -> list[str]:
    """A table with one line per row, each column's cell beside its title."""
    return table([c.title for c in columns], [[c.cell(row) for c in columns] for row in rows])


def when(unix: float | None) -> str:
    if unix is None:
        return "–"
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0] if lines else "–"


def error_block(title: str, text: str) -> list[str]:
    """An error in the report: its first line, then the rest (a log's tail) verbatim."""
    first, _, rest = text.strip().partition("\n")
    out = [f"> **{title}:** {first}", ""]
    if rest.strip():
        out += ["```text", rest.strip("\n").replace("```", "` ` `"), "```", ""]
    return out


def server_facts(st: Startup | None, title: str = "Server") -> list[str]:
    if st is None:
        return []
    return [
        f"{title}: weights {num(st.weights_gib)} GiB ({st.weights_source or 'unknown'}"
        + (f", {st.quantization}" if st.quantization else "")
        + f"), KV pool {integer(st.kv_cache_tokens)} tokens = "
        f"{integer(st.kv_cache_blocks)} blocks × {integer(st.block_size)} tokens, "
        f"KV memory {num(st.kv_cache_memory_bytes, scale=1 / GIB)}"
        f" GiB, ready after {st.startup_seconds:.0f} s"
        + (f", log `{st.log_path}`" if st.log_path else "")
        + ".",
        "",
    ]


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)


def plot_name(phase: PhaseResult, what: str) -> str:
    return f"plots/{_slug(phase.name)}-{what}.png"


def png(fig: Any) -> bytes:
    plt = pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
