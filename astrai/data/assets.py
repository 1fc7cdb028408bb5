"""Data that ships with the package (astrai/assets/): the tiny corpus presets' tokenizers use."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def tiny_corpus_path() -> Path:
    """The bundled ~45 KB public-domain corpus (Shakespeare + a few multilingual lines)."""
    return Path(str(resources.files("astrai") / "assets" / "tiny_corpus.txt"))
