"""Reading a JSON file that must hold an object, with one-line errors naming the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from astrai.errors import AstraiError, ConfigError


def read_json_object(path: str | Path, error: type[AstraiError] = ConfigError,
                     hint: str = "") -> dict[str, Any]:
    """The object in `path`; `error("path: problem[; hint]")` when the file is missing,
    unreadable, not JSON or not an object."""
    path = Path(path)
    tail = f"; {hint}" if hint else ""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(f"{path}: file not found{tail}") from None
    except json.JSONDecodeError as e:
        raise error(f"{path}: line {e.lineno}: invalid JSON ({e.msg}){tail}") from None
    except RecursionError:  # json nests by recursion: thousands of [ or { exhaust the stack
        raise error(f"{path}: JSON nested too deeply to read (over ~1000 levels){tail}"
                    ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{path}: unreadable ({e}){tail}") from None
    if not isinstance(data, dict):
        raise error(f"{path}: expected a JSON object, got {type(data).__name__}{tail}")
    return data
