#!/usr/bin/env python
"""Write constraints.txt: every package astrai[dev] installs, pinned to the version installed.

    python scripts/pin_constraints.py            # rewrite constraints.txt from this environment
    python scripts/pin_constraints.py --check    # exit 1 if this environment differs from it

The README's set-up installs with `-c constraints.txt`, so a fresh clone gets the versions
the suite last passed with, whatever has been released since (pip's "constraints files":
they pin a version without asking for the package). Refresh it deliberately: in a fresh
virtual environment, install without the file (`pip install torch==2.13.0 && pip install -e
".[dev]"`), run the suite, and if it passes, run this script there and commit the result.

Only astrai[dev]'s dependency closure is written (walked through each distribution's
Requires-Dist with its markers evaluated here), not whatever else the environment holds.
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as canonical

ROOT = Path(__file__).resolve().parent.parent
HEADER = """\
# Versions the test suite last passed with; the README's set-up installs with -c constraints.txt.
# Refresh deliberately: python scripts/pin_constraints.py (see its docstring).
"""


def wanted(req: Requirement, extras: set[str], env: dict[str, str]) -> bool:
    """Whether a Requires-Dist line applies here with `extras` requested."""
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**env, "extra": e}) for e in extras | {""})


def closure(root: str, extras: set[str]) -> dict[str, str]:
    """{canonical name: installed version} of `root[extras]`'s installed dependencies."""
    env = default_environment()
    seen: dict[str, set[str]] = {}
    versions: dict[str, str] = {}
    todo = [(root, extras)]
    while todo:
        name, ext = todo.pop()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional dependency not installed on this platform
        key = canonical(dist.metadata["Name"])
        if key in seen and ext <= seen[key]:
            continue
        seen[key] = seen.get(key, set()) | ext
        versions[key] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if wanted(req, ext, env):
                todo.append((req.name, set(req.extras)))
    versions.pop(canonical(root), None)
    return versions


def render(versions: dict[str, str]) -> str:
    # A local label (torch's "+cpu") is dropped: "==2.13.0" matches every build of it.
    lines = [f"{k}=={v.split('+')[0]}" for k, v in sorted(versions.items())]
    return HEADER + "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if constraints.txt differs")
    args = ap.parse_args()
    text = render(closure("astrai", {"dev"}))
    path = ROOT / "constraints.txt"
    if args.check:
        same = path.exists() and path.read_text() == text
        print("constraints.txt is current" if same else "constraints.txt differs", file=sys.stderr)
        return 0 if same else 1
    path.write_text(text)
    print(f"wrote {path} ({text.count(chr(10)) - 2} packages)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
