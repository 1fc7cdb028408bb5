import json
from pathlib import Path

import pytest

from astrai.data.testing import tiny_tokenizer

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "data"


@pytest.fixture(scope="session")
def tok(tmp_path_factory):
    """A 512-id byte-level BPE tokenizer trained on the bundled corpus (shared, read-only)."""
    return tiny_tokenizer(tmp_path_factory.mktemp("tok"), 512)


def _write_jsonl(path: Path, records) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in records)
    return path


@pytest.fixture
def write_jsonl():
    """write_jsonl(path, records): records are dicts, or raw strings written as-is."""
    return _write_jsonl


@pytest.fixture(scope="session")
def examples():
    """examples/data of the repository."""
    return EXAMPLES


@pytest.fixture
def spec_for(tok, tmp_path):
    """spec_for(kind, inputs, **fields) -> a validated spec writing to tmp_path/out."""
    from astrai.config.preprocess import load_spec

    def make(kind, inputs, **fields):
        data = {"kind": kind, "inputs": [str(p) for p in inputs], "tokenizer": str(tok.path),
                "output": str(tmp_path / "out"), **fields}
        return load_spec(data=data)

    return make
