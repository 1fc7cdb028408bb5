"""`astrai convert-checkpoint SRC DST`: DCP shards <-> model.safetensors + optimizer.pt."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("convert-checkpoint")
    def convert_cmd(
        src: Annotated[Path, typer.Argument(help="A checkpoint directory (DCP or full).")],
        dst: Annotated[Path, typer.Argument(help="The new directory to write (must not "
                                                 "exist).")],
    ) -> None:
        """Convert a checkpoint between the DCP format (dcp/: every rank's shards, written
        by --checkpoint-format dcp) and the full one (model.safetensors + optimizer.pt), in
        one process. Config, tokenizer, meta and training state are copied, so a converted
        training checkpoint resumes."""
        from astrai.train.convert_checkpoint import convert_checkpoint

        written = convert_checkpoint(src, dst)
        typer.echo(f"wrote {dst} ({'DCP shards' if written == 'dcp' else 'model.safetensors'})")
