"""matplotlib at arm's length: the install hint, an empty figure of a pixel size, saving."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from astrai.errors import ConfigError, MissingExtraError

PLOT_INSTALL = "pip install 'astrai[plot]'"
"""How to get matplotlib (the `plot` extra)."""
FORMATS = (".png", ".svg")
DPI = 100


def has_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def require_matplotlib(what: str = "plotting") -> None:
    if not has_matplotlib():
        raise MissingExtraError(f"{what} needs matplotlib, which is not installed: "
                                f"{PLOT_INSTALL}")


def parse_size(text: str, field: str = "--size") -> tuple[int, int]:
    """'1200x800' -> (1200, 800) pixels."""
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ConfigError(f"{field}: '{text}' is not WIDTHxHEIGHT in pixels "
                          "(e.g. 1200x800)") from None
    if not (64 <= w <= 10000 and 64 <= h <= 10000):
        raise ConfigError(f"{field}: {w}x{h} pixels is outside 64..10000 on a side")
    return w, h


def new_figure(size: tuple[int, int]) -> Any:
    """An empty Figure of exactly `size` pixels when saved as PNG (at DPI dots per inch)."""
    require_matplotlib()
    from matplotlib.figure import Figure

    w, h = size
    return Figure(figsize=(w / DPI, h / DPI), dpi=DPI, layout="constrained")


def check_out(path: str | Path, field: str = "--out") -> Path:
    """The output path, validated before any work: .png or .svg."""
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise ConfigError(f"{field}: {path} must end in .png or .svg")
    if path.is_dir():
        raise ConfigError(f"{field}: {path} is a directory; name a .png or .svg file")
    return path


def save_figure(fig: Any, path: str | Path) -> Path:
    """Write `fig` as PNG or SVG (by suffix) through a temporary file, so a failure never
    leaves half a picture behind; PNGs have exactly the figure's pixel size."""
    path = check_out(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fig.savefig(tmp, format=path.suffix.lower()[1:], dpi=DPI,
                    metadata={"Software": None} if path.suffix.lower() == ".png" else None)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
