"""Every relative link of the docs resolves: the file (or folder) it names exists, and the
anchor it names is a heading of that file, as GitHub makes anchors of headings."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parent.parent
# The lab's own reports under docs/results/ are a run's output, kept as it wrote them.
PAGES = sorted(
    {
        *REPO.glob("*.md"),
        *REPO.glob("docs/*.md"),
        *REPO.glob("docs/results/*.md"),
        *REPO.glob("docs/results/*/README.md"),
        REPO / "alerts" / "runbook.md",
        REPO / "benchmarks" / "README.md",
    }
)
LINK = re.compile(r"\[(?:[^\]`]|`[^`]*`)*\]\(([^)\s]+)\)")  # pictures too


def _prose(text: str) -> str:
    """The text outside fenced code blocks and code spans, where a link is a link."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "``", text)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: its text lower-cased, punctuation dropped,
    spaces as hyphens (links and code shown as their text)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor, repeated ones numbered as GitHub numbers them."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    seen: Counter[str] = Counter()
    found = set()
    for m in re.finditer(r"^#{1,6} +(.+?) *#*$", text, flags=re.M):
        anchor = github_anchor(m.group(1))
        found.add(f"{anchor}-{seen[anchor]}" if seen[anchor] else anchor)
        seen[anchor] += 1
    return found


def broken_links(page: Path, root: Path = REPO) -> list[str]:
    broken = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / unquote(path)).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no {resolved.relative_to(root)}")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved.relative_to(root)}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_anchor_rule_is_githubs() -> None:
    assert github_anchor("Cold start, from vLLM's log (`--vllm-log`)") == (
        "cold-start-from-vllms-log---vllm-log"
    )
    assert github_anchor("Data-parallel pods: 100 × 8 engines, 2026-12-01") == (
        "data-parallel-pods-100--8-engines-2026-12-01"
    )
    assert github_anchor("`bench_poll.py`: what one poll of vLLM costs the exporter") == (
        "bench_pollpy-what-one-poll-of-vllm-costs-the-exporter"
    )


def test_a_broken_link_and_a_missing_anchor_are_named(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Title\n\n## A part\n\n## A part\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#a-part-1) [gone](missing.md) [anchor](other.md#nothing)\n"
        "`[not a link](missing.md)` and ![a picture](other.md)\n"
        "```\n[in code](missing.md)\n```\n"
    )
    assert broken_links(page, tmp_path) == [
        "missing.md: no missing.md",
        "other.md#nothing: no heading #nothing in other.md",
    ]
