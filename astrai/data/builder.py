"""`astrai preprocess`: JSONL records -> a dataset directory (manifest + shards + tokenizer).

Reading, packing and writing stream with bounded buffers, so memory stays flat on any input
size. Tokenization runs in the Rust library's parallel `encode_batch`, and with
`workers > 1` in worker processes as well (output order does not depend on the count).
The directory is written under a temporary name and renamed at the end: an interrupted or
failed run never leaves a dataset that looks complete.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from astrai.config.preprocess import PreprocessSpec
from astrai.data.encode import RecordEncoder
from astrai.data.manifest import MANIFEST, write_manifest
from astrai.data.output import check_output, dataset_output  # noqa: F401  (re-exported)
from astrai.data.packing import Packer, split_spans, truncate_span
from astrai.data.sources import check_units, corpus_files, file_units, shard_units
from astrai.data.store import ShardWriter
from astrai.data.tokenizer import Tokenizer
from astrai.data.workers import CHUNK_BYTES, Encoders, default_workers, iter_chunks
from astrai.diskfull import writing
from astrai.errors import ConfigError, DataError

MAX_LISTED_ERRORS = 5
UINT16_VOCAB = 1 << 16  # ids 0..65535 fit in uint16


def token_dtype_for(vocab_size: int) -> str:
    """uint16 token storage when every id fits, else uint32."""
    return "uint16" if vocab_size <= UINT16_VOCAB else "uint32"


@dataclass
class SplitStats:
    """Counts for one split; the closing summary of `astrai preprocess`."""

    records_read: int = 0
    records_kept: int = 0
    filtered_short: int = 0
    filtered_long: int = 0
    malformed: int = 0
    samples: int = 0
    tokens: int = 0
    dropped_tokens: int = 0
    capacity: int = 0
    shards: list[dict] = field(default_factory=list)

    @property
    def packing_efficiency(self) -> float | None:
        return self.tokens / self.capacity if self.capacity else None


@dataclass
class BuildResult:
    """What `build_dataset` returns (and `astrai preprocess --json` prints)."""

    output: str
    kind: str
    format: str
    splits: dict[str, SplitStats]
    errors: list[str]
    elapsed_s: float
    startup_s: float

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.splits.values())

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict:
        splits = {}
        for name, s in self.splits.items():
            d = asdict(s)
            d["packing_efficiency"] = s.packing_efficiency
            splits[name] = d
        return {"output": self.output, "kind": self.kind, "format": self.format,
                "splits": splits, "tokens": self.tokens, "skipped_errors": self.errors[:20],
                "elapsed_s": round(self.elapsed_s, 3), "startup_s": round(self.startup_s, 3),
                "tokens_per_s": round(self.tokens_per_s, 1)}


class _SplitWriter:
    """Rows -> shards of one split, starting a new shard before max_tokens_per_shard."""

    def __init__(self, root: Path, split: str, fmt: str, dtypes: dict[str, str],
                 token_keys: tuple[str, ...], max_tokens: int, stats: SplitStats) -> None:
        self.root, self.split, self.fmt, self.dtypes = root, split, fmt, dtypes
        self.token_keys, self.max_tokens, self.stats = token_keys, max_tokens, stats
        (root / split).mkdir(parents=True, exist_ok=True)
        self.cur: ShardWriter | None = None
        self.cur_tokens = 0

    def _close_shard(self) -> None:
        if self.cur is not None:
            self.cur.close()
            name = self.cur.path.relative_to(self.root).as_posix()
            self.stats.shards.append({"path": name, "samples": self.cur.n,
                                      "tokens": self.cur_tokens})
            self.cur = None

    def add(self, row: dict[str, np.ndarray]) -> None:
        n = sum(len(row[k]) for k in self.token_keys)
        if self.cur is not None and self.cur_tokens + n > self.max_tokens:
            self._close_shard()
        if self.cur is None:
            i = len(self.stats.shards)
            name = f"shard_{i:05d}.h5" if self.fmt == "h5" else f"shard_{i:05d}"
            self.cur = ShardWriter(self.root / self.split / name, self.fmt, self.dtypes)
            self.cur_tokens = 0
        self.cur.add(row)
        self.cur_tokens += n
        self.stats.samples += 1
        self.stats.tokens += n

    def close(self) -> None:
        self._close_shard()


class _Sink:
    """Rows of one split -> its shard writer (opened at the first row, when the grpo mode is
    known); counts packed capacity for the efficiency figure."""

    TOKEN_KEYS = ("input_ids", "chosen", "rejected", "prompts", "responses")

    def __init__(self, root: Path, split: str, spec: PreprocessSpec, token_dtype: str,
                 stats: SplitStats, groups: dict) -> None:
        self.root, self.split, self.spec, self.token_dtype = root, split, spec, token_dtype
        self.stats, self.groups = stats, groups
        self.writer: _SplitWriter | None = None

    def add(self, row: dict) -> None:
        if self.writer is None:
            dtypes = dtypes_for(self.spec, self.token_dtype, self.groups.get("mode") == "offline")
            self.writer = _SplitWriter(
                self.root, self.split, self.spec.format, dtypes,
                tuple(k for k in self.TOKEN_KEYS if k in dtypes),
                self.spec.max_tokens_per_shard, self.stats)
        self.writer.add(row)
        if self.spec.kind in ("pretrain", "sft") and self.spec.packing.mode != "none":
            self.stats.capacity += self.spec.row_len

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def dtypes_for(spec: PreprocessSpec, token_dtype: str, offline_grpo: bool) -> dict[str, str]:
    """Stored keys and their dtypes per kind (docs/formats.md)."""
    if spec.kind in ("pretrain", "sft"):
        d = {"input_ids": token_dtype, "doc_lens": "int32"}
        if spec.has_loss_mask:
            d["loss_mask"] = "uint8"
        return d
    if spec.kind == "dpo":
        return {"chosen": token_dtype, "rejected": token_dtype,
                "chosen_mask": "uint8", "rejected_mask": "uint8"}
    if offline_grpo:
        return {"prompts": token_dtype, "responses": token_dtype, "response_lens": "int32",
                "masks": "uint8", "rewards": "float32"}
    return {"prompts": token_dtype, "reference": "uint8"}


def _cut(arrs: dict[str, np.ndarray], keys: tuple[str, ...], span: tuple[int, int]) -> dict:
    return {k: (arrs[k][span[0]:span[1]] if k in keys else arrs[k]) for k in arrs}


def _docs(spec: PreprocessSpec, payload: dict, stats: SplitStats) -> Iterator[dict]:
    """Truncate (or, for bfd_split, split) a pretrain/sft record into packable documents."""
    n = len(payload["input_ids"])
    keys = tuple(payload)
    if n > spec.max_seq_len and spec.packing.mode == "bfd_split":
        for span in split_spans(n, spec.max_seq_len):
            yield _cut(payload, keys, span)
        return
    span = truncate_span(n, spec.max_seq_len, spec.truncation)
    stats.dropped_tokens += n - (span[1] - span[0])
    yield _cut(payload, keys, span)


def _truncate_pair(spec: PreprocessSpec, payload: dict, stats: SplitStats) -> dict:
    """dpo: cut chosen and rejected so they keep one identical prompt (left truncation takes
    the same tokens off both prompts' starts); grpo: cut the prompt."""
    out = dict(payload)
    L = spec.max_seq_len
    if "chosen" in payload:
        keys = ("chosen", "rejected")
        start = 0
        if spec.truncation == "left":
            prompt = int(np.argmax(payload["chosen_mask"])) if payload["chosen_mask"].any() else 0
            start = min(max(0, max(len(payload[k]) for k in keys) - L), prompt)
        for k in keys:
            n = len(payload[k])
            end = min(n, start + L)
            stats.dropped_tokens += n - (end - start)
            out[k], out[f"{k}_mask"] = payload[k][start:end], payload[f"{k}_mask"][start:end]
        return out
    n = len(payload["prompts"])
    span = truncate_span(n, L, spec.truncation)
    stats.dropped_tokens += n - (span[1] - span[0])
    out["prompts"] = payload["prompts"][span[0]:span[1]]
    return out


ProgressFn = Callable[[dict], None]


def parse_shard(text: str) -> tuple[int, int]:
    """`I/N` -> (I, N) with 0 <= I < N; a ConfigError naming the syntax otherwise."""
    i, sep, n = text.partition("/")
    if not (sep and i.strip().isdigit() and n.strip().isdigit()) or not (
            0 <= int(i) < int(n)):
        raise ConfigError(f"--shard '{text}': expected I/N with 0 <= I < N (e.g. --shard 0/8 "
                          "for the first of 8 shards)")
    return int(i), int(n)


def _split_units(spec: PreprocessSpec, shard: tuple[int, int] | None) -> dict[str, list]:
    """The input units of each split; a shard takes its part of the train inputs, and shard
    0 alone builds the (small) val split, so merged shards hold it once."""
    train = corpus_files(spec.inputs, "inputs")
    units = {"train": shard_units(train, *shard, "inputs") if shard else
             file_units(train, split_row_groups=False)}
    if spec.val_inputs and (shard is None or shard[0] == 0):
        units["val"] = file_units(corpus_files(spec.val_inputs, "val_inputs"), False)
    for u in units.values():
        check_units(u, spec)
    return units


def build_dataset(spec: PreprocessSpec, *, workers: int | None = 1, on_error: str = "fail",
                  progress: ProgressFn | None = None,
                  shard: tuple[int, int] | None = None,
                  command: dict | None = None) -> BuildResult:
    """Run the spec; return the summary. Raises ConfigError / DataError on bad input, leaving
    the output directory untouched. `workers` None: the cores, fewer for a small input
    (the dataset is the same for any count). `shard` (I, N): build only shard I of N of the
    inputs (`astrai preprocess merge` joins the N datasets). `command`: the spec file and
    --set overrides it came from ({"spec", "set"}), kept in the manifest so a rebuild can
    be spelled out (`retokenize_command`)."""
    t0 = time.perf_counter()
    if on_error not in ("fail", "skip"):
        raise ConfigError(f"--on-error '{on_error}': choose fail or skip")
    out = Path(spec.output)
    if not Path(spec.tokenizer).exists():
        raise ConfigError(f"tokenizer: {spec.tokenizer} does not exist; train one with "
                          "`astrai tokenizer train` or fix the spec's 'tokenizer' path")
    tok = Tokenizer.load(spec.tokenizer)
    RecordEncoder(spec, tok)  # applies spec.chat_template; no template for chat data: fail now
    splits = _split_units(spec, shard)
    token_dtype = token_dtype_for(tok.vocab_size)
    if workers is None:  # a process per chunk at most: small inputs skip the pool start
        size = sum(u.size for units in splits.values() for u in units)
        workers = min(default_workers(), 1 + size // CHUNK_BYTES)
    inputs = [u.path for units in splits.values() for u in units] + [Path(spec.tokenizer)]
    with writing(out), dataset_output(out, spec.overwrite, inputs) as tmp:
        encoders = Encoders(spec, tok, Path(spec.tokenizer), max(1, workers))
        startup = time.perf_counter() - t0
        t1 = time.perf_counter()
        errors: list[str] = []
        all_stats: dict[str, SplitStats] = {}
        groups: dict = {}  # grpo: the first record's mode and group size, which all must share
        try:
            for split, units in splits.items():
                all_stats[split] = _build_split(
                    _SplitRun(spec, split, on_error, errors, groups, progress, t1),
                    units, encoders, _Sink(tmp, split, spec, token_dtype, SplitStats(), groups))
            elapsed = time.perf_counter() - t1
            tok.save(tmp / "tokenizer")
            offline = groups.get("mode") == "offline"
            write_manifest(tmp / MANIFEST, spec=spec, tok=tok, token_dtype=token_dtype,
                           dtypes=dtypes_for(spec, token_dtype, offline),
                           stats=all_stats, offline_grpo=offline,
                           shard={"index": shard[0], "count": shard[1]} if shard else None,
                           command=command)
        finally:
            encoders.close()
    return BuildResult(str(out), spec.kind, spec.format, all_stats, errors, elapsed, startup)


@dataclass
class _SplitRun:
    """What one split's pass shares with the whole build: the error list, grpo's group shape."""

    spec: PreprocessSpec
    split: str
    on_error: str
    errors: list[str]
    groups: dict
    progress: ProgressFn | None
    t0: float

    @property
    def failing(self) -> bool:
        return bool(self.errors) and self.on_error == "fail"


def _build_split(run: _SplitRun, units: list, encoders: Encoders, sink: _Sink) -> SplitStats:
    """Encode, filter, pack and write one split; raises DataError when a record is bad and
    on_error is fail (after listing up to MAX_LISTED_ERRORS of them)."""
    spec, stats = run.spec, sink.stats
    files = list(dict.fromkeys(u.path for u in units))
    total = sum(u.size for u in units)
    packer = Packer(spec.packing.mode or "none", spec.row_len, spec.packing.buffer,
                    spec.packing.min_piece)
    limit = spec.max_records if run.split == "train" else None
    for results, done in encoders.map(iter_chunks(units, spec, limit)):
        for res in results:
            for row in _take(run, res, stats, packer):
                sink.add(row)
        if run.failing and len(run.errors) >= MAX_LISTED_ERRORS:
            break
        if run.progress:
            run.progress({"split": run.split, "records": stats.records_read,
                          "tokens": stats.tokens, "elapsed": time.perf_counter() - run.t0,
                          "bytes_done": done, "bytes_total": total})
    if run.failing:
        raise DataError(_error_summary(run.errors))
    for row in packer.finish():
        sink.add(row)
    sink.close()
    _check_split(run.split, files, stats)
    return stats


def _take(run: _SplitRun, res: tuple, stats: SplitStats, packer: Packer) -> list:
    """The rows one encoded record adds (none when it is malformed or filtered out)."""
    spec = run.spec
    stats.records_read += 1
    status, where = res[0], res[1]
    if status == "error":
        stats.malformed += 1
        if len(run.errors) < 10_000:
            run.errors.append(res[2])
        return []
    if status == "filtered":
        stats.filtered_short += res[2] == "short"
        stats.filtered_long += res[2] == "long"
        return []
    if run.failing:
        return []  # the run fails; keep scanning only to list more bad lines
    payload = res[2]
    bad = _grpo_mismatch(payload, run.groups) if spec.kind == "grpo" else None
    if bad:
        stats.malformed += 1
        run.errors.append(f"{where}: {bad}")
        return []
    stats.records_kept += 1
    if spec.kind in ("pretrain", "sft"):
        return [row for doc in _docs(spec, payload, stats) for row in packer.add(doc)]
    return [_truncate_pair(spec, payload, stats)]


def _grpo_mismatch(payload: dict, first: dict) -> str | None:
    """All grpo records share one mode (online/offline) and, offline, one group size."""
    mode = "offline" if "responses" in payload else "online"
    size = len(payload["response_lens"]) if mode == "offline" else 0
    first.setdefault("mode", mode)
    first.setdefault("size", size)
    if mode != first["mode"]:
        return ("mixes online records (prompt, reference) with offline groups (responses, "
                "rewards); put them in two datasets")
    if size != first["size"]:
        return (f"has {size} responses but earlier records have {first['size']}; every offline "
                "GRPO record needs the same group size")
    return None


def _error_summary(errors: list[str]) -> str:
    shown = "; ".join(errors[:MAX_LISTED_ERRORS])
    more = "" if len(errors) <= MAX_LISTED_ERRORS else " (first 5 shown)"
    return (f"{len(errors)} bad record{'s' if len(errors) > 1 else ''}{more}: {shown} — fix "
            "them, or pass --on-error skip to leave them out")


def _check_split(split: str, files: list[Path], stats: SplitStats) -> None:
    names = ", ".join(str(f) for f in files)
    if stats.records_read == 0:
        raise DataError(f"{'inputs' if split == 'train' else 'val_inputs'}: no records in "
                        f"{names}; the input is empty")
    if stats.samples == 0:
        raise DataError(
            f"{split}: no record kept of {stats.records_read} read ({stats.filtered_short} "
            f"shorter than filters.min_chars, {stats.filtered_long} longer than "
            f"filters.max_chars, {stats.malformed} malformed); adjust the filters or inputs")
