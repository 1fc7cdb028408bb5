"""`--model PRESET|CONFIG|CHECKPOINT|HF_DIR`: what model a run starts from.

* preset name: the preset with vocab_size set to the dataset tokenizer's and max_seq_len
  raised to the training length when shorter; `model_overrides` apply; fresh init (seeded).
* config file (.json/.yaml): a ModelConfig (vocab_size defaults to the tokenizer's).
* astrai checkpoint or HF directory: its weights (fine-tuning). Its vocabulary must hold the
  dataset's tokenizer, and when it carries a tokenizer, that tokenizer must map text to the
  same ids (same fingerprint) — otherwise training would silently scramble the embeddings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from astrai.config.files import read_config_file
from astrai.errors import ConfigError
from astrai.model.config import ModelConfig
from astrai.model.gguf_file import is_gguf
from astrai.model.init import build_model
from astrai.model.presets import PRESETS, get_preset


@dataclass
class ModelSource:
    config: ModelConfig
    model_fn: Callable[[], nn.Module]
    kind: str
    """preset | config | checkpoint"""
    desc: str


def _fingerprint(tokenizer_dir: Path) -> str | None:
    from astrai.data.tokenizer import Tokenizer

    if not (tokenizer_dir / "tokenizer.json").is_file():
        return None
    return Tokenizer.load(tokenizer_dir).fingerprint()


def resolve_model(spec: str, *, vocab_size: int, seq_len: int, seed: int,
                  overrides: dict[str, Any] | None = None,
                  tokenizer_fingerprint: str | None = None,
                  dataset: str | Path | None = None) -> ModelSource:
    """Validate `spec` against the dataset (vocab, length) and say how to build it.
    `dataset`: the dataset directory, so that a checkpoint whose tokenizer does not fit it
    is refused with the command that rebuilds it with the checkpoint's tokenizer."""
    overrides = dict(overrides or {})
    path = Path(spec)
    if spec in PRESETS:
        base = PRESETS[spec]
        cfg = {"vocab_size": vocab_size,
               "max_seq_len": max(base.get("max_seq_len", seq_len), seq_len), **overrides}
        config = get_preset(spec, **cfg)
        _check_vocab(config, vocab_size, f"preset '{spec}'")
        return ModelSource(config, lambda: build_model(config, seed=seed), "preset",
                           f"preset {spec}")
    if path.is_file() and not is_gguf(path):
        data = read_config_file(
            path, what="a model config (a mapping of ModelConfig fields)",
            hint=f"; --model takes a preset ({', '.join(PRESETS)}), a model config file or a "
                 "checkpoint directory")
        data = {"vocab_size": vocab_size, **data, **overrides}
        data["max_seq_len"] = max(int(data.get("max_seq_len", seq_len)), seq_len)
        config = ModelConfig.from_dict(data, source=str(path))
        _check_vocab(config, vocab_size, str(path))
        return ModelSource(config, lambda: build_model(config, seed=seed), "config",
                           f"config {path}")
    if path.is_dir() or is_gguf(path):
        from astrai.model.hf import load_pretrained

        if overrides:
            raise ConfigError(
                f"model_overrides: cannot change the architecture of checkpoint {path}; "
                "drop model_overrides or start from a preset"
            )
        model, config, _ = load_pretrained(path, dtype=None)
        _check_vocab(config, vocab_size, str(path), _retokenize_hint(path, dataset))
        if tokenizer_fingerprint is not None:
            theirs = _fingerprint(path)
            if theirs is not None and theirs != tokenizer_fingerprint:
                raise ConfigError(
                    f"{path}: the model's tokenizer differs from the dataset's (fingerprint "
                    f"{theirs} vs {tokenizer_fingerprint}); "
                    + (_retokenize_hint(path, dataset)
                       or "preprocess the data with the model's tokenizer")
                )
        if config.max_seq_len < seq_len:
            raise ConfigError(
                f"{path}: max_seq_len {config.max_seq_len} is shorter than the training "
                f"length {seq_len}; pass --window-size {config.max_seq_len} or less"
            )
        model.train()
        return ModelSource(config, lambda: model, "checkpoint", f"checkpoint {path}")
    raise ConfigError(
        f"model: '{spec}' is neither a preset ({', '.join(PRESETS)}), a config file, nor a "
        "checkpoint directory"
    )


def _retokenize_hint(checkpoint: Path, dataset: str | Path | None) -> str | None:
    """How to rebuild `dataset` with the checkpoint's tokenizer (the exact command), or None
    when the dataset is unknown or the checkpoint carries no tokenizer."""
    import shlex

    from astrai.data.manifest import retokenize_command

    if dataset is None or not (checkpoint / "tokenizer.json").is_file():
        return None
    command, out = retokenize_command(dataset, checkpoint)
    return (f"rebuild the data with the checkpoint's tokenizer: {command}, then train with "
            f"--data {shlex.quote(str(out))}")


def _check_vocab(config: ModelConfig, vocab_size: int, source: str,
                 fix: str | None = None) -> None:
    if config.vocab_size < vocab_size:
        raise ConfigError(
            f"{source}: vocab_size {config.vocab_size} is smaller than the dataset "
            f"tokenizer's {vocab_size}; the model cannot embed every token id; "
            + (fix or "use a matching model, or let a preset take the tokenizer's vocabulary")
        )
    if config.vocab_size != vocab_size and source.startswith("preset"):
        raise ConfigError(
            f"{source}: model_overrides.vocab_size {config.vocab_size} does not match the "
            f"dataset tokenizer's {vocab_size}; drop the override"
        )
