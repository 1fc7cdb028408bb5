"""Config files: the mapping a YAML or JSON file holds, with errors naming the file and line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from astrai.errors import ConfigError


def read_config_file(path: str | Path, what: str = "a mapping of train options",
                     missing: str = "config file not found",
                     hint: str = "") -> dict[str, Any]:
    """The mapping in a YAML or JSON config file; errors name the file and line, say the
    file should hold `what`, and end with `hint`; `missing` says what a missing file is."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: {missing}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file; expected {what} (YAML or JSON)"
                          f"{hint}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: line {e.lineno}: invalid JSON ({e.msg})") from None
    except RecursionError:  # both parsers nest by recursion
        raise ConfigError(f"{path}: nested too deeply to read (over ~1000 levels); expected "
                          f"{what}{hint}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise ConfigError(f"{path}: {where}invalid YAML ({getattr(e, 'problem', e)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected {what} (YAML or JSON), got "
                          f"{type(data).__name__}{hint}")
    return data


def key_line(path: Path, key: str | tuple[str, ...]) -> int | None:
    """1-based line of `key` in a YAML/JSON file (JSON is YAML), if found: a top-level key,
    or the path of a nested one (`("optimizer", "max_lr")`)."""
    try:
        node = yaml.compose(path.read_text())
    except (yaml.YAMLError, RecursionError):
        return None
    line = None
    for part in (key,) if isinstance(key, str) else key:
        if not isinstance(node, yaml.MappingNode):
            return None
        found = next(((k, v) for k, v in node.value if getattr(k, "value", None) == part), None)
        if found is None:
            return None
        line, node = found[0].start_mark.line + 1, found[1]
    return line
