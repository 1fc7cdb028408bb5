"""Reading raw input: files or globs of .jsonl / .jsonl.gz (and plain text for tokenizers)."""

from __future__ import annotations

import glob
import gzip
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from astrai.errors import DataError

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz")


def walk_glob(pattern: str) -> list[str]:
    """The paths matching `pattern`, sorted, without entering symlinked directories: `**`
    walks only the real tree below the pattern's fixed prefix (pathlib's glob), where
    `glob.glob(recursive=True)` follows a link to `/` through the whole filesystem."""
    parts = Path(pattern).parts
    fixed = next(i for i, part in enumerate(parts) if glob.has_magic(part))
    root = Path(*parts[:fixed]) if fixed else Path()
    rest = str(Path(*parts[fixed:]))
    # as glob.glob, a wildcard does not match hidden names unless the pattern spells a dot
    hidden_ok = any(part.startswith(".") and part not in (".", "..") for part in parts[fixed:])
    return sorted(str(p) for p in root.glob(rest)
                  if hidden_ok or not any(part.startswith(".")
                                          for part in p.relative_to(root).parts))


def expand_inputs(patterns: Sequence[str | Path], what: str = "inputs",
                  dir_suffixes: tuple[str, ...] | None = None) -> list[Path]:
    """Files named by `patterns` (globs allowed), in order, without duplicates. With
    `dir_suffixes`, a directory stands for its files ending so (recursively, sorted)."""
    out: list[Path] = []
    for pat in patterns:
        pat = str(pat)
        hits = walk_glob(pat) if glob.has_magic(pat) else [pat]
        if dir_suffixes is not None:
            hits = [str(f) for h in hits for f in (
                sorted(p for p in Path(h).rglob("*")
                       if p.is_file() and p.name.lower().endswith(dir_suffixes))
                if Path(h).is_dir() else [Path(h)])]
        hits = [h for h in hits if Path(h).is_file()]
        if not hits:
            raise DataError(f"{what}: '{pat}' matches no file; check the path")
        out.extend(Path(h) for h in hits if Path(h) not in out)
    return out


def is_jsonl(path: Path) -> bool:
    return path.name.lower().endswith(JSONL_SUFFIXES)


UTF8_BOM = b"\xef\xbb\xbf"


def iter_raw_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, raw bytes) for each non-blank line, undecoded; a UTF-8 byte order mark
    at the start of the file is dropped (Python's `utf-8-sig`: editors on Windows write it)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            for n, raw in enumerate(f, 1):
                if n == 1 and raw.startswith(UTF8_BOM):
                    raw = raw[len(UTF8_BOM):]
                if raw.strip():
                    yield n, raw
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: cannot be read ({e})") from e


def decode_line(raw: bytes, where: str) -> str:
    """The UTF-8 text of one line, or a DataError naming `where` (file:line)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{where}: not valid UTF-8 ({e.reason} at byte {e.start}); "
                        "re-encode the file as UTF-8") from None


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) for each non-blank line; bad UTF-8 names the file and line."""
    for n, raw in iter_raw_lines(path):
        yield n, decode_line(raw, f"{path}:{n}")


def json_error(e: json.JSONDecodeError) -> str:
    """`msg at column N` of a JSON error (some of json's messages already end in "at")."""
    msg = e.msg.removesuffix(" at").removesuffix(":")
    return f"{msg} at column {e.colno}"


def load_json(text: str, where: str) -> Any:
    """json.loads(text); a one-line DataError naming `where` when it is not JSON, or nests
    deeper than Python's parser recurses."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{where}: invalid JSON ({json_error(e)})") from None
    except RecursionError:
        raise DataError(f"{where}: invalid JSON (nested too deeply to parse); flatten the "
                        "record") from None


def parse_record(line: str, where: str) -> dict[str, Any]:
    """One JSONL record; DataError naming `where` (file:line) when it is not a JSON object."""
    rec = load_json(line, where)
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    return rec


def record_text(rec: dict, field: str, where: str) -> str:
    """Text of `field`: a string, or the contents of a message list joined by newlines."""
    if field not in rec:
        raise DataError(f"{where}: missing field '{field}' (keys: {', '.join(sorted(rec))})")
    value = rec[field]
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        return "\n".join(str(m.get("content", "")) for m in value)
    raise DataError(f"{where}: field '{field}' must be a string, got {type(value).__name__}")


def iter_texts(files: Sequence[Path], field: str = "text") -> Iterator[str]:
    """Texts for tokenizer training: `field` of JSONL records, or lines of plain text files."""
    for path in files:
        if is_jsonl(path):
            for n, line in iter_lines(path):
                where = f"{path}:{n}"
                yield record_text(parse_record(line, where), field, where)
        else:
            for _, line in iter_lines(path):
                yield line
