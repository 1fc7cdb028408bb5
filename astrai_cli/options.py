"""Options several commands share, defined once."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

THREADS_HELP = ("CPU threads: N, or auto (the faster of 1 and all cores, measured at start: "
                "on a busy machine one thread can be several times faster) \\[default: all "
                "cores].")


def threads_option(panel: str | None = None) -> Any:
    """`--threads N|auto`, for `Annotated[str | None, threads_option()] = None`."""
    return typer.Option("--threads", metavar="N|auto", help=THREADS_HELP, show_default=False,
                        rich_help_panel=panel)


def use_threads(value: str | None) -> int:
    """Validate --threads (one-line error, exit 2) and apply it; the count in use."""
    from astrai.threads import apply_threads, parse_threads

    return apply_threads(parse_threads(value))


def checkpoint_path(path: str | Path, err: Any = None, training: bool = False) -> Path:
    """A checkpoint argument: a training run directory stands for its newest checkpoint, and
    a line on stderr says which; a GGUF file is read as it is, with a line saying which of
    its weights load dequantized (`training`: that fine-tuning starts from it)."""
    from rich.console import Console

    from astrai.model.checkpoint import resolve_checkpoint
    from astrai.model.gguf_file import is_gguf

    resolved, note = resolve_checkpoint(path)
    notes = [note] if note else []
    if is_gguf(resolved) and resolved.is_file():
        from astrai.model.gguf_load import gguf_notes

        notes += gguf_notes(resolved, training)
    for line in notes:
        (err or Console(stderr=True)).print(line, highlight=False, soft_wrap=True,
                                            markup=False)
    return resolved


Device = Annotated[str, typer.Option("--device", help="auto | cpu | cuda | cuda:N.")]
Dtype = Annotated[str, typer.Option(
    "--dtype", help="auto (bf16 on CUDA, fp32 on CPU) | float32 | bfloat16 | float16.")]
Backend = Annotated[str | None, typer.Option(
    "--backend", help="Attention backend: torch_native | flash | cuda (default: automatic).")]
Adapter = Annotated[Path | None, typer.Option(
    "--adapter", metavar="DIR", help="A PEFT LoRA adapter directory (adapter_config.json + "
    "adapter_model.safetensors) merged into the weights; default: a LoRA checkpoint's own "
    "adapter/.")]
Loras = Annotated[list[str] | None, typer.Option(
    "--lora", metavar="NAME=DIR", help="Serve the PEFT LoRA adapter DIR unmerged beside the "
    "base as model NAME (repeatable; adapters of any rank and targets share one batch).")]
MaxLoras = Annotated[int | None, typer.Option(
    "--max-loras", help="Adapters resident in one batch (default: as many as --lora, at "
    "least 1); requests for others wait for a slot.")]
MaxLoraRank = Annotated[int, typer.Option(
    "--max-lora-rank", help="The largest LoRA adapter rank served (as vLLM's); a higher-rank "
    "adapter is refused at load.")]
Quantize = Annotated[str, typer.Option(
    "--quantize", help="Weight format: none | int8 (per-channel int8 weights) | int4 (groups "
    "of 32 with a scale each, llama.cpp's q4_0) for the blocks and the LM head, made at load "
    "time; docs/engine.md \"Weight formats\".")]
EnforceEager = Annotated[bool, typer.Option(
    "--enforce-eager", help="Run every step through the eager ragged path (no static decode "
    "step, no CUDA graphs; docs/engine.md \"Decode step\").")]
Speculative = Annotated[str, typer.Option(
    "--speculative", metavar="none|ngram", help="Speculative decoding: ngram (prompt lookup: "
    "propose what followed the latest match of the last tokens; docs/engine.md "
    "\"Speculative decoding\"). --speculative-model picks a draft model instead.")]
SpeculativeModel = Annotated[Path | None, typer.Option(
    "--speculative-model", metavar="DIR", help="A smaller model sharing the tokenizer that "
    "proposes the tokens (speculative decoding with a draft model).")]
NumSpeculativeTokens = Annotated[int, typer.Option(
    "--num-speculative-tokens", metavar="K", help="Tokens proposed per request and step "
    "(with --speculative or --speculative-model).")]
MaxContext = Annotated[int | None, typer.Option(
    "--max-context", help="Context length (default: the model's max_seq_len).")]


def _kv_cache_dtype(value: str) -> str | None:
    """CacheConfig.dtype of a --kv-cache-dtype value (None: the model's)."""
    if value not in ("auto", "float32", "bfloat16", "float16"):
        raise typer.BadParameter(f"{value!r}: use auto, float32, bfloat16 or float16")
    return None if value == "auto" else value


KvCacheDtype = Annotated[str | None, typer.Option(
    "--kv-cache-dtype", metavar="auto|float32|bfloat16|float16", callback=_kv_cache_dtype,
    help="The KV cache's dtype (auto: the model's). A 16-bit cache under fp32 or int8 / int4 "
    "weights halves its memory and the bytes each decode step reads (llama.cpp's default "
    "cache is f16).")]


def speculative_config(method: str, model: Path | None, k: int) -> Any:
    """The SpeculativeConfig of the three flags, or None when off (one-line errors)."""
    from astrai.errors import ConfigError
    from astrai.infer.config import SpeculativeConfig

    if method not in ("none", "ngram"):
        raise ConfigError(f"--speculative '{method}': use none or ngram (a draft model: "
                          "--speculative-model DIR)")
    if model is not None and method == "ngram":
        raise ConfigError("--speculative ngram and --speculative-model: give one of them")
    if model is None and method == "none":
        return None
    if model is not None:
        model = checkpoint_path(model)  # a run directory: its newest checkpoint
    if model is not None and not (model / "config.json").is_file():
        raise ConfigError(f"--speculative-model {model}: not a model directory (no "
                          "config.json)")
    fields = {"method": "ngram" if model is None else "draft", "num_speculative_tokens": k,
              "model": None if model is None else str(model)}
    return SpeculativeConfig.from_dict(fields, "--num-speculative-tokens")


def warn_dtype(device: str, dtype: str | None, err: Any = None) -> None:
    """Print the library's one-line warning on stderr when --dtype would be slow here."""
    from astrai.infer.loading import dtype_warning

    note = dtype_warning(device, None if dtype == "auto" else dtype)
    if note is not None:
        if err is None:
            print(note, file=sys.stderr, flush=True)
        else:
            err.print(note, highlight=False, soft_wrap=True, markup=False)


LOG_WIDTH = 200
"""Columns a console takes when it is not a terminal (rich's default there is 80)."""


def log_console(stderr: bool = False, file: Any = None) -> Any:
    """A rich Console that wraps lines only on a terminal. Written to a log file or a pipe
    (`2>log`), rich would hard-wrap every line at 80 columns, mid-sentence; there a line
    keeps its length (soft wrap) and tables get LOG_WIDTH columns to lay out in."""
    from rich.console import Console

    console = Console(stderr=stderr, file=file, highlight=False)
    if not console.is_terminal:
        console.soft_wrap = True
        console.width = max(console.width, LOG_WIDTH)
    return console


def parse_loras(items: list[str] | None) -> dict[str, str]:
    """--lora NAME=DIR items -> {NAME: DIR}; ConfigError on a malformed or repeated one."""
    from astrai.errors import ConfigError

    out: dict[str, str] = {}
    for item in items or []:
        name, sep, path = item.partition("=")
        name = name.strip()
        if not sep or not name or not path:
            raise ConfigError(f"--lora '{item}': expected NAME=DIR (e.g. --lora "
                              "sql=adapters/sql)")
        if name in out:
            raise ConfigError(f"--lora {name}: given twice; give each adapter one name")
        out[name] = path
    return out
