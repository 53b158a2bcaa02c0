"""What this glassbox was built from: its version, the git revision and the Python.

The revision is found, in order:

1. `GLASSBOX_REVISION` in the environment: the image sets it from the `REVISION` build
   argument (`scripts/build-image.sh` passes `git rev-parse HEAD`);
2. the git checkout the code runs from (an editable install or a clone on `PYTHONPATH`),
   asked once with `git rev-parse HEAD`;
3. otherwise `unknown`: a wheel installed without either cannot know it, and says so.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

from vllm_glassbox import __version__

REVISION_ENV = "GLASSBOX_REVISION"
UNKNOWN = "unknown"
#: The repository root when running from a checkout (glassbox/ is one of its folders).
SOURCE_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Build:
    version: str
    revision: str
    python_version: str


def git_revision(root: Path) -> str | None:
    """HEAD's commit of the checkout at `root`, or None (not a checkout, or no git)."""
    if not (root / ".git").exists():
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else None


def revision(environ: dict[str, str] | None = None, root: Path = SOURCE_ROOT) -> str:
    env = (os.environ if environ is None else environ).get(REVISION_ENV, "").strip()
    return env or git_revision(root) or UNKNOWN


@functools.cache
def this_build() -> Build:
    return Build(__version__, revision(), platform.python_version())
