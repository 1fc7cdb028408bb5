"""`key=value` command-line items (--set, --model-override, --strategy-kwargs, ...).

The value is read as JSON when it is JSON (`2`, `0.1`, `true`, `[1, 2]`, `"x"`) and kept as
the raw string otherwise, so `--set packing.mode=bfd` needs no quotes.
"""

from __future__ import annotations

import json
from typing import Any

from astrai.errors import ConfigError


def parse_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def parse_pair(item: str, option: str, example: str) -> tuple[str, Any]:
    """`key=value` -> (key, value); ConfigError naming `option` and an `example` if no '='."""
    if "=" not in item:
        raise ConfigError(f"{option} '{item}': expected key=value (e.g. {option} {example})")
    key, raw = item.split("=", 1)
    return key.strip(), parse_value(raw)


def parse_pairs(items: list[str] | None, option: str, example: str) -> dict[str, Any]:
    """Several items into one dict (a later key wins)."""
    return dict(parse_pair(item, option, example) for item in items or [])
