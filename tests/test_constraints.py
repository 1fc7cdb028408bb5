"""constraints.txt pins every dependency the README's set-up installs, within pyproject's ranges.

A new release of a dependency must not change what a fresh clone installs until someone
refreshes the file on purpose (scripts/pin_constraints.py); a dependency added to
pyproject.toml without a pin, or a pin outside the range pyproject allows, fails here.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as canonical
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


def pins() -> dict[str, Version]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not name==version"
            out[canonical(name)] = Version(version)
    return out


def project_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = project["dependencies"] + project["optional-dependencies"]["dev"]
    return [Requirement(line) for line in lines]


def test_every_dependency_is_pinned_inside_its_range():
    pinned = pins()
    for req in project_requirements():
        name = canonical(req.name)
        assert name in pinned, f"{req.name} is not pinned: run scripts/pin_constraints.py"
        assert req.specifier.contains(pinned[name], prereleases=True), (
            f"{req.name}=={pinned[name]} is outside pyproject's {req.specifier}")


def test_readme_setup_and_ci_install_with_the_constraints():
    readme = (ROOT / "README.md").read_text()
    setup = readme.split("## Set up", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    assert "-c constraints.txt" in setup
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"pip install .*-e \"\.\[dev\]\" .*-c constraints\.txt", ci)
