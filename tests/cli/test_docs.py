"""docs/: the generated spec reference is current, and the index reaches a page for every
command (each page exists and shows the command)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import typer.main

from astrai_cli.main import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_spec_reference_is_current(tmp_path):
    gen = _script("gen_spec_reference")
    assert gen.main(["--check"]) == 0, "run python scripts/gen_spec_reference.py"
    stale = tmp_path / "ref.md"
    stale.write_text((DOCS / "spec-reference.md").read_text().replace("bfd_split", "bfd-x"))
    assert gen.main(["--check", "--out", str(stale)]) == 1


def test_spec_reference_lists_every_key():
    from astrai.config.preprocess import Filters, Packing, PreprocessSpec, Section

    text = (DOCS / "spec-reference.md").read_text()
    for model in (PreprocessSpec, Section, Filters, Packing):
        for name in model.model_fields:
            assert f"| `{name}` |" in text, f"{model.__name__}.{name}"
    assert "| `kind` | `\"pretrain\"` \\| `\"sft\"` \\| `\"dpo\"` \\| `\"grpo\"` | **required** |" \
        in text


def test_type_rendering():
    gen = _script("gen_spec_reference")
    assert gen.type_of({"type": "integer", "minimum": 1}) == "integer ≥ 1"
    assert gen.type_of({"anyOf": [{"type": "integer"}, {"type": "null"}]}) == "integer or null"
    assert gen.type_of({"type": "array", "items": {"$ref": "#/$defs/Section"}}) == \
        "list of [Section](#section)"


def test_index_links_resolve():
    text = (DOCS / "index.md").read_text()
    targets = {m.group(1) for m in LINK.finditer(text)}
    assert targets, "no links"
    missing = sorted(t for t in targets if not (DOCS / t).is_file())
    assert not missing, f"docs/index.md links to missing pages: {missing}"


def test_every_command_has_a_page_from_the_index():
    """Each top-level command appears in the index's command table on a row that links a
    page which exists and shows that command being run."""
    rows = [line for line in (DOCS / "index.md").read_text().splitlines()
            if line.startswith("| `astrai ")]
    for name in typer.main.get_command(app).list_commands(None):
        row = next((r for r in rows if r.startswith(f"| `astrai {name}")), None)
        assert row is not None, f"docs/index.md has no row for `astrai {name}`"
        page = LINK.search(row).group(1)
        assert f"astrai {name}" in (DOCS / page).read_text(), f"{page} never shows {name}"


def test_quickstart_page_lists_every_option():
    cmd = typer.main.get_command(app).get_command(None, "quickstart")
    text = (DOCS / "quickstart.md").read_text()
    opts = [o for p in cmd.params for o in p.opts if o.startswith("--") and o != "--help"]
    assert opts and not [o for o in opts if f"`{o}" not in text]
