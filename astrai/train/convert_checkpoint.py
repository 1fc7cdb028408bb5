"""`astrai convert-checkpoint SRC DST`: a checkpoint from one format to the other.

    full -> dcp   model.safetensors + optimizer.pt  ->  dcp/ (one process writes it)
    dcp  -> full  dcp/ (every rank's shards)         ->  model.safetensors + optimizer.pt

Everything else (config.json, tokenizer files, meta.json, scheduler.pt, trainer_state.pt)
is copied, so a converted training checkpoint still resumes. The optimizer state changes
layout with the format: optimizer.pt is torch.optim's own, keyed by parameter index with
`param_names` beside it; DCP's is keyed by parameter name
(torch.distributed.checkpoint.state_dict). The destination appears whole or not at all
(written to a temporary sibling directory, then renamed).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from astrai.atomic import atomic_dir
from astrai.errors import CheckpointError
from astrai.model.checkpoint import (
    CONFIG,
    META,
    TOKENIZER_FILES,
    WEIGHTS,
    load_extra,
    read_meta,
    read_safetensors,
    require_checkpoint_dir,
    save_weights,
)
from astrai.model.dcp_format import DCP_DIR, is_dcp, read_optimizer, read_tensors, write_tensors
from astrai.train.executors.fsdp import index_to_fqn

SMALL = (CONFIG, *TOKENIZER_FILES, "scheduler.pt", "trainer_state.pt")


def convert_checkpoint(src: str | Path, dst: str | Path) -> str:
    """Write `src` in the other format at `dst` (which must not exist); returns the format
    written ("dcp" or "full")."""
    src, dst = require_checkpoint_dir(src), Path(dst)
    if dst.exists() or dst.is_symlink():
        raise CheckpointError(f"{dst}: already exists; convert-checkpoint writes a new "
                              "directory (choose another DST)")
    if (src / "adapter").is_dir():
        raise CheckpointError(f"{src}: a LoRA checkpoint (adapter/ in PEFT's format) stays "
                              "in the full format; export it with `astrai export` instead")
    to = "full" if is_dcp(src) and not (src / WEIGHTS).is_file() else "dcp"
    with atomic_dir(dst, overwrite=False) as tmp:
        for name in SMALL:
            if (src / name).is_file():
                shutil.copy2(src / name, tmp / name)
        meta = read_meta(src)
        if meta:
            import json

            meta["checkpoint_format"] = to
            (tmp / META).write_text(json.dumps(meta, indent=2, default=str) + "\n")
        if to == "full":
            _to_full(src, tmp)
        else:
            _to_dcp(src, tmp)
    return to


def _to_full(src: Path, tmp: Path) -> None:
    import torch

    save_weights(read_tensors(src), tmp / WEIGHTS)
    optimizer = read_optimizer(src)
    if optimizer is not None:
        torch.save(optimizer, tmp / "optimizer.pt")


def _to_dcp(src: Path, tmp: Path) -> None:
    state: dict[str, Any] = {"model": read_safetensors([src / WEIGHTS])}
    try:
        optimizer = load_extra(src, "optimizer")
    except Exception as e:  # noqa: BLE001 - any unpickling failure means a bad file
        raise CheckpointError(f"{src / 'optimizer.pt'}: unreadable ({type(e).__name__}); "
                              "convert a checkpoint whose files are whole") from None
    if optimizer:
        names = optimizer.get("param_names")
        if not names:
            raise CheckpointError(f"{src / 'optimizer.pt'}: no param_names (written before "
                                  "astrai stored them), so its state cannot be keyed by "
                                  "name; convert the weights alone by removing optimizer.pt")
        state["optimizer"] = index_to_fqn(
            {"state": optimizer["state"], "param_groups": optimizer["param_groups"]}, names)
    write_tensors(tmp / DCP_DIR, state)
