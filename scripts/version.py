"""Print glassbox's version, read from glassbox/__init__.py (its one written place) without
importing the package: scripts/build-image.sh and the release workflow run it with any
Python 3.
"""

import ast
import sys
from pathlib import Path

INIT = Path(__file__).resolve().parent.parent / "glassbox" / "__init__.py"


def version(init: Path = INIT) -> str:
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [
            "__version__"
        ]:
            value = ast.literal_eval(node.value)
            if isinstance(value, str):
                return value
    raise SystemExit(f"{init}: no __version__ = '...'")


if __name__ == "__main__":
    sys.stdout.write(version() + "\n")
