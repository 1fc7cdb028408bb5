"""The preprocessing spec (`astrai preprocess spec.json`): typed, validated, no unknown keys.

Paths are taken as given (relative paths resolve against the current directory), like every
other astrai path option.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from astrai.config.files import read_config_file
from astrai.config.pairs import parse_pair
from astrai.errors import ConfigError
from astrai.typed_config import TypedConfig

Kind = Literal["pretrain", "sft", "dpo", "grpo"]
Mask = Literal["train", "mask"]
# The longest row a spec may ask for (2^20 tokens): past it a row's attention mask and a
# model's RoPE table no longer fit in memory, so a larger figure is a typo, not a plan.
MAX_ROW_TOKENS = 1 << 20


class _Strict(TypedConfig):
    model_config = ConfigDict(extra="forbid", validate_assignment=True,
                              use_attribute_docstrings=True)
    unknown_key_hint = "see `astrai preprocess --schema`"


class Section(_Strict):
    """One field of a record, tokenized in order; the sections' tokens are concatenated."""

    field: str
    """Record key holding the text (a string) or, with template: true, a message list."""
    action: Literal["train", "mask", "$role"] = "train"
    """train: loss on these tokens; mask: no loss; $role: per message, by the `roles` rules."""
    template: bool = False
    """Render the field (a message list) through the tokenizer's chat template."""

    @model_validator(mode="after")
    def _role_needs_template(self) -> Section:
        if self.action == "$role" and not self.template:
            raise ValueError(f"section '{self.field}': action '$role' needs template: true")
        return self


class Filters(_Strict):
    """Record filters, applied to pretrain text only (chat and task records are kept)."""

    min_chars: int = Field(50, ge=0)
    """Drop pretrain records shorter than this many characters."""
    max_chars: int = Field(2_000_000, ge=1)
    """Drop pretrain records longer than this many characters."""


class Packing(_Strict):
    """How tokenized records are placed into training rows."""

    mode: Literal["none", "simple", "bfd", "bfd_split"] | None = None
    """none: one record per row; simple: sequential fill; bfd: best-fit decreasing;
    bfd_split: split records longer than max_seq_len, then bfd. Default: bfd_split for
    pretrain, none otherwise."""
    max_len: int | None = Field(None, ge=2, le=MAX_ROW_TOKENS)
    """Capacity of a packed row in tokens (default: max_seq_len)."""
    buffer: int = Field(2048, ge=1)
    """bfd works on this many records at a time, so memory stays flat on any input size."""
    min_piece: int = Field(32, ge=1)
    """bfd_split: fewest tokens of a document cut off to fill another row's gap."""


class PreprocessSpec(_Strict):
    """`astrai preprocess` spec: JSONL or Parquet records in, a dataset directory out."""

    kind: Kind
    """pretrain (text), sft (chat / prompt-response), dpo (preference pairs), grpo (prompts)."""
    inputs: list[str] = Field(min_length=1)
    """Training files, globs or directories (.jsonl, .jsonl.gz, .jsonl.zst, .parquet)."""
    val_inputs: list[str] = []
    """Held-out files, globs or directories, written as the `val` split."""
    tokenizer: str
    """Tokenizer directory (astrai or HF); a copy goes into the dataset."""
    output: str
    """Dataset directory to create (written to a temporary directory, then renamed)."""
    overwrite: bool = False
    """Replace an existing output that is a dataset astrai wrote (its manifest.json) and
    holds none of the inputs and no file its manifest does not list; any other existing
    output is refused."""
    chat_template: str | None = None
    """Chat template for template sections, dpo and grpo, replacing the tokenizer's own: a
    name (chatml, llama3, qwen2.5, mistral, llama2) or a .jinja file. The dataset's copy of
    the tokenizer keeps it, so chat after training renders the same way."""
    sections: list[Section] | None = None
    """Fields to tokenize, in order. Default per kind: pretrain [text: train];
    sft [messages: $role, template]. dpo and grpo use their fixed record keys."""
    roles: dict[str, Mask] = {"system": "mask", "user": "mask", "assistant": "train",
                              "tool": "mask"}
    """Mask rule per message role for $role sections; a role with no rule is an error."""
    filters: Filters = Field(default_factory=Filters)
    """Record filters (pretrain text only)."""
    max_records: int | None = Field(None, ge=1)
    """Read at most this many records of the training inputs."""
    max_seq_len: int = Field(2048, ge=2, le=MAX_ROW_TOKENS)
    """Longest record in tokens; longer ones are truncated (bfd_split splits them instead)."""
    truncation: Literal["right", "left"] = "right"
    """Which end of an over-long record is cut."""
    packing: Packing = Field(default_factory=Packing)
    """Packing of records into rows."""
    position_ids: Literal["none", "doc_reset", "continuous"] = "doc_reset"
    """none: no position ids; doc_reset: restart at 0 per document; continuous: 0..T-1."""
    add_bos: bool = True
    """Prepend BOS to each non-template record (a template writes its own BOS, if any)."""
    add_eos: bool = True
    """Append EOS to each non-template record (trained when the last section is)."""
    format: Literal["h5", "bin"] = "h5"
    """Shard format: HDF5 (.h5) or raw memory-mapped arrays (.bin + .idx)."""
    max_tokens_per_shard: int = Field(100_000_000, ge=1)
    """Start a new shard before a shard would exceed this many tokens."""

    @model_validator(mode="after")
    def _consistent(self) -> PreprocessSpec:
        if self.packing.mode is None:
            self.packing.mode = "bfd_split" if self.kind == "pretrain" else "none"
        if self.kind in ("dpo", "grpo") and self.packing.mode != "none":
            raise ValueError(f"packing.mode: {self.kind} records are never packed; use 'none'")
        if self.kind in ("dpo", "grpo") and self.sections is not None:
            raise ValueError(f"sections: {self.kind} uses fixed record keys "
                             "(see docs/formats.md); remove 'sections'")
        if self.packing.max_len is not None and self.packing.max_len < self.max_seq_len:
            raise ValueError(f"packing.max_len ({self.packing.max_len}) is below max_seq_len "
                             f"({self.max_seq_len}); raise it or lower max_seq_len")
        if self.filters.min_chars > self.filters.max_chars:
            raise ValueError("filters.min_chars is above filters.max_chars")
        return self

    @property
    def resolved_sections(self) -> list[Section]:
        if self.sections is not None:
            return self.sections
        if self.kind == "sft":
            return [Section(field="messages", action="$role", template=True)]
        return [Section(field="text", action="train")]

    @property
    def row_len(self) -> int:
        """Capacity of one stored row."""
        return self.packing.max_len or self.max_seq_len

    @property
    def has_loss_mask(self) -> bool:
        """A text spec with no template and no sections trains on every token (no mask)."""
        secs = self.resolved_sections
        return any(s.template or s.action != "train" for s in secs)


def parse_override(item: str) -> tuple[list[str], Any]:
    """`key.sub=value` -> (["key", "sub"], value); value parsed as JSON when it is JSON."""
    key, value = parse_pair(item, "--set", "packing.mode=bfd")
    return [k for k in key.split(".") if k], value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply `--set key=value` items to a spec dict (dotted keys reach nested fields)."""
    out = json.loads(json.dumps(data))
    for item in overrides:
        keys, value = parse_override(item)
        if not keys:
            raise ConfigError(f"--set '{item}': empty key")
        if keys[0] not in out and len(keys) > 1:
            # --set roles.tool=mask adds to the default rules instead of replacing them
            default = PreprocessSpec.model_fields.get(keys[0])
            if default is not None and isinstance(default.default, dict):
                out[keys[0]] = dict(default.default)
        node = out
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set '{item}': '{k}' is not a section of the spec")
        node[keys[-1]] = value
    return out


def load_spec(path: str | Path | None = None, overrides: list[str] | None = None,
              data: dict | None = None) -> PreprocessSpec:
    """Read a JSON (or YAML) spec file, apply `--set` overrides, validate."""
    source = str(path) if path is not None else "spec"
    if data is None:
        if path is None:
            raise ConfigError("no spec given: pass a spec file (see examples/specs/)")
        data = read_config_file(path, what="a spec object", missing="spec file does not exist")
    return PreprocessSpec.from_dict(apply_overrides(data, overrides or []), source)


def spec_schema() -> dict:
    """The JSON Schema of the spec, for editors (`astrai preprocess --schema`)."""
    return PreprocessSpec.model_json_schema()
