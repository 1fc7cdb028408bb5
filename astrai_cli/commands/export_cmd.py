"""`astrai export CHECKPOINT OUT --format hf|gguf`: a directory transformers loads, or one
GGUF file llama.cpp runs."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from astrai.errors import ConfigError
from astrai_cli.options import Adapter, checkpoint_path, log_console


class ExportFormat(str, Enum):
    hf = "hf"
    gguf = "gguf"


class ExportDtype(str, Enum):
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"
    f32 = "f32"
    bf16 = "bf16"
    f16 = "f16"


DTYPE_NAMES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


class Quantize(str, Enum):
    q8_0 = "q8_0"
    q4_0 = "q4_0"
    q4_1 = "q4_1"
    q5_0 = "q5_0"
    q5_1 = "q5_1"


def register(app: typer.Typer) -> None:
    @app.command("export")
    def export_cmd(
        checkpoint: Annotated[Path, typer.Argument(
            metavar="CHECKPOINT", help="Checkpoint directory (astrai or HF format).")],
        out_dir: Annotated[Path, typer.Argument(
            metavar="OUT", help="Directory (hf) or .gguf file (gguf) to write; must not "
            "exist (an hf directory may be empty) unless --overwrite.")],
        fmt: Annotated[ExportFormat, typer.Option(
            "--format", help="hf: a Llama / Qwen2 / Qwen3 / Mistral directory; gguf: one "
            "file for llama.cpp, ollama, LM Studio.")
        ] = ExportFormat.hf,
        dtype: Annotated[ExportDtype, typer.Option(
            "--dtype", help="Weight dtype to write; auto keeps the checkpoint's. GGUF keeps "
            "1-D tensors (norms, biases) in f32.")
        ] = ExportDtype.auto,
        quantize: Annotated[Quantize | None, typer.Option(
            "--quantize", help="gguf only: the 2-D weights in llama.cpp's 32-value blocks: "
            "q8_0, q4_0 (astrai's --quantize int4 holds the same numbers), q4_1, q5_0, q5_1; "
            "norms and biases stay f32.")
        ] = None,
        overwrite: Annotated[bool, typer.Option(
            "--overwrite", help="Replace an earlier export at OUT (an hf directory holding "
            "the .astrai-export marker and only the files it lists, a GGUF file with the "
            "astrai.export key); anything else is refused.")
        ] = False,
        merge_lora: Annotated[bool, typer.Option(
            "--merge-lora", help="Fold the LoRA adapter (--adapter, or the checkpoint's "
            "adapter/) into the weights: full merged weights, no adapter needed.")] = False,
        adapter: Adapter = None,
    ) -> None:
        """Export a checkpoint to Hugging Face format or to GGUF (llama.cpp)."""
        import torch  # lazily: `astrai --help` stays fast

        name = DTYPE_NAMES.get(dtype.value, dtype.value)
        torch_dtype = None if dtype is ExportDtype.auto else getattr(torch, name)
        checkpoint = checkpoint_path(checkpoint)
        if fmt is ExportFormat.gguf:
            from astrai.model.gguf_export import export_gguf

            out = export_gguf(checkpoint, out_dir, dtype=torch_dtype, overwrite=overwrite,
                              quantize=quantize.value if quantize else None,
                              merge_lora=merge_lora, adapter=adapter)
            size = out.stat().st_size / 2**20
            log_console().print(f"exported {checkpoint} → {out} (gguf, "
                                           f"{size:.1f} MiB)")
            return
        if quantize is not None:
            raise ConfigError("--quantize applies to --format gguf only; drop it or pass "
                              "--format gguf")
        from astrai.model.hf_export import export_hf

        out = export_hf(checkpoint, out_dir, dtype=torch_dtype, overwrite=overwrite,
                        merge_lora=merge_lora, adapter=adapter)
        files = ", ".join(sorted(p.name for p in out.iterdir() if not p.name.startswith(".")))
        log_console().print(f"exported {checkpoint} → {out} ({fmt.value}): {files}")
