"""Options several commands share, declared once (same flag, same help everywhere)."""

from __future__ import annotations

from typing import Annotated

import typer

Device = Annotated[str, typer.Option("--device", help="auto | cpu | cuda | cuda:N.")]
Dtype = Annotated[str, typer.Option(
    "--dtype", help="auto (bf16 on CUDA, fp32 on CPU) | float32 | bfloat16 | float16.")]
Backend = Annotated[str | None, typer.Option(
    "--backend", help="Attention backend: torch_native | flash | cuda (default: automatic).")]
MaxContext = Annotated[int | None, typer.Option(
    "--max-context", help="Context length (default: the model's max_seq_len).")]
