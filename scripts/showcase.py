#!/usr/bin/env python3
"""The README's "What the demo shows" section, from a real demo run's output.

    scripts/showcase.py demo-out     # after scripts/demo.sh: picture, findings, times
    scripts/showcase.py --check      # the README's section is what docs/demo/ holds

It copies one dashboard picture of the run into docs/demo/, keeps what the section
says (the report's summary, the run's times from demo-out/timing.txt, the machine) in
docs/demo/showcase.json, and rewrites the README between its two markers from that
file. Nothing in the section is written by hand; `--check` (run by the tests) fails
when the README and docs/demo/showcase.json disagree.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BEGIN = "<!-- showcase: begin (scripts/showcase.py writes this section) -->"
END = "<!-- showcase: end -->"
PICTURE = "glassbox-overview.png"  # every mechanism at a glance, the flood among them
PICTURE_WIDTH = 1600  # pixels: readable on GitHub, a few hundred KB


def summary_lines(report: str) -> list[str]:
    """The bullet lines of the report's "## Summary" section."""
    section = re.search(r"^## Summary\n(.*?)(?=^## |\Z)", report, re.M | re.S)
    if section is None:
        raise ValueError("the report has no '## Summary' section")
    return [line[2:] for line in section.group(1).splitlines() if line.startswith("- ")]


def read_timing(text: str) -> dict[str, int]:
    """demo-out/timing.txt: 'name seconds' lines, as scripts/demo.sh writes them."""
    pairs = (line.split() for line in text.splitlines() if line.strip())
    return {name: int(value) for name, value in pairs}


def machine(cpuinfo: str, cores: int) -> str:
    model = next(
        (line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if "model name" in line),
        "unknown CPU",
    )
    flags = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    avx512 = "with" if " avx512f" in flags else "without"
    return f"{cores} cores of an {model} {avx512} AVX-512"


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def render(showcase: dict[str, Any]) -> str:
    """The README section, from docs/demo/showcase.json's content."""
    setup, demo = showcase["setup_seconds"], showcase["demo_seconds"]
    lines = [
        BEGIN,
        "## What the demo shows",
        "",
        f"![{showcase['picture_title']}, drawn by the demo]({showcase['picture']})",
        "",
        f"A demo run on {showcase['date']} ({showcase['machine']}): set-up {minutes(setup)}, "
        f"`glassbox demo` {minutes(demo)}, **{minutes(setup + demo)} from a fresh clone**. "
        "Its report's summary, as the report words it:",
        "",
        *[f"- {line}" for line in showcase["summary"]],
        "",
        "The picture is the demo's own drawing of the overview dashboard over its run; the "
        "report (`demo-out/report.md`) embeds every dashboard's and the lab's plots. "
        "`scripts/showcase.py demo-out` rewrites this section from a demo's output.",
        END,
    ]
    return "\n".join(lines)


def replace_section(readme: str, section: str) -> str:
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README.md lacks the markers {BEGIN!r} … {END!r}")
    return readme[:start] + section + readme[end + len(END) :]


def current_section(readme: str) -> str:
    start, end = readme.find(BEGIN), readme.find(END)
    return readme[start : end + len(END)] if 0 <= start < end else ""


def collect(demo_out: Path, docs: Path) -> dict[str, Any]:
    """What the section says, read from a demo's output; the picture copied beside."""
    from datetime import UTC, datetime

    from PIL import Image

    results = json.loads((demo_out / "results.json").read_text())
    timing = read_timing((demo_out / "timing.txt").read_text())
    if timing.get("status", 0) != 0 or results.get("status") != "ok":
        raise ValueError(f"the demo in {demo_out} did not finish well: not shown")
    docs.mkdir(parents=True, exist_ok=True)
    with Image.open(demo_out / "dashboards" / PICTURE) as image:
        height = round(image.height * PICTURE_WIDTH / image.width)
        image.convert("RGB").resize((PICTURE_WIDTH, height), Image.LANCZOS).save(
            docs / PICTURE, optimize=True
        )
    return {
        "date": datetime.fromtimestamp(results["started_at"], UTC).date().isoformat(),
        "machine": machine(Path("/proc/cpuinfo").read_text(), os.cpu_count() or 0),
        "setup_seconds": timing["setup_seconds"],
        "demo_seconds": timing["demo_seconds"],
        "summary": summary_lines((demo_out / "report.md").read_text()),
        "picture": str((docs / PICTURE).relative_to(ROOT)),
        "picture_title": "The overview dashboard",
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("demo_out", nargs="?", type=Path, help="a demo's output directory")
    p.add_argument("--check", action="store_true", help="README agrees with docs/demo/?")
    args = p.parse_args(argv)
    readme_path, docs = ROOT / "README.md", ROOT / "docs" / "demo"
    readme = readme_path.read_text()
    if args.check:
        showcase = json.loads((docs / "showcase.json").read_text())
        if current_section(readme) != render(showcase):
            print("README.md's demo section is not docs/demo/showcase.json's", file=sys.stderr)
            return 1
        return 0
    if args.demo_out is None:
        p.error("a demo's output directory, or --check")
    try:
        showcase = collect(args.demo_out, docs)
        readme = replace_section(readme, render(showcase))
    except (OSError, ValueError, KeyError) as e:
        print(f"showcase: {e}", file=sys.stderr)
        return 2
    (docs / "showcase.json").write_text(json.dumps(showcase, indent=2, ensure_ascii=False) + "\n")
    readme_path.write_text(readme)
    print(f"showcase: README.md and {docs.relative_to(ROOT)} from {args.demo_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
