"""`astrai export CHECKPOINT OUT_DIR --format hf`: a directory transformers loads."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from astrai_cli.options import Adapter, checkpoint_path


class ExportFormat(str, Enum):
    hf = "hf"


class ExportDtype(str, Enum):
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


def register(app: typer.Typer) -> None:
    @app.command("export")
    def export_cmd(
        checkpoint: Annotated[Path, typer.Argument(
            metavar="CHECKPOINT", help="Checkpoint directory (astrai or HF format).")],
        out_dir: Annotated[Path, typer.Argument(
            metavar="OUT_DIR", help="Directory to write (must not exist, or be empty, unless --overwrite).")],
        fmt: Annotated[ExportFormat, typer.Option(
            "--format", help="Output format: hf (Llama / Qwen2 / Qwen3 / Mistral layout).")
        ] = ExportFormat.hf,
        dtype: Annotated[ExportDtype, typer.Option(
            "--dtype", help="Weight dtype to write; auto keeps the checkpoint's.")
        ] = ExportDtype.auto,
        overwrite: Annotated[bool, typer.Option(
            "--overwrite", help="Replace an earlier export at OUT_DIR (one holding the "
            ".astrai-export marker and only the files it lists); anything else is refused.")
        ] = False,
        merge_lora: Annotated[bool, typer.Option(
            "--merge-lora", help="Fold the LoRA adapter (--adapter, or the checkpoint's "
            "adapter/) into the weights: full merged weights, no adapter needed.")] = False,
        adapter: Adapter = None,
    ) -> None:
        """Export a checkpoint to Hugging Face format (AutoModelForCausalLM.from_pretrained)."""
        import torch  # lazily: `astrai --help` stays fast

        from astrai.model.hf_export import export_hf

        torch_dtype = None if dtype is ExportDtype.auto else getattr(torch, dtype.value)
        checkpoint = checkpoint_path(checkpoint)
        out = export_hf(checkpoint, out_dir, dtype=torch_dtype, overwrite=overwrite,
                        merge_lora=merge_lora, adapter=adapter)
        files = ", ".join(sorted(p.name for p in out.iterdir() if not p.name.startswith(".")))
        Console(highlight=False).print(f"exported {checkpoint} → {out} ({fmt.value}): {files}")
