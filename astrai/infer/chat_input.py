"""A chat message read from a terminal or a pipe: multi-line input rules (no I/O of its own)."""

from __future__ import annotations

from typing import Any


def collect_message(read: Any, first: str = ">>> ", more: str = "... ") -> str:
    """Read one message through `read(prompt) -> line` (input() in a terminal).

    Multi-line input: end a line with a backslash to continue on the next, or open a block
    with a line starting with three double quotes and close it with a line ending with
    three double quotes. EOFError inside a block returns what was read."""
    line = read(first)
    if line.lstrip().startswith('"""'):
        first = line.lstrip()[3:]
        if first.rstrip().endswith('"""'):
            return first.rstrip()[:-3]
        lines = [first] if first else []
        while True:
            try:
                nxt = read(more)
            except EOFError:
                break
            if nxt.rstrip().endswith('"""'):
                lines.append(nxt.rstrip()[:-3])
                break
            lines.append(nxt)
        return "\n".join(lines).strip("\n")
    lines = []
    while line.endswith("\\"):
        lines.append(line[:-1])
        try:
            line = read(more)
        except EOFError:
            line = ""
            break
    lines.append(line)
    return "\n".join(lines)
