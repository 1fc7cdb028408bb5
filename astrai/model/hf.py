"""Hugging Face interop at the boundary: load Llama / Qwen2 / Qwen3 / Mistral directories
(writing them is `astrai.model.hf_export`).

`load_pretrained` accepts an astrai checkpoint directory or a HF-format directory
(config.json + model.safetensors, or shards + model.safetensors.index.json). Weights only
ever come from safetensors; nothing downloads; transformers is never imported and no remote
code runs. Tokenizer files stay where they are for the tokenizer loader.

HF's Llama family uses the same rotate-half RoPE layout as astrai, so weights map by name
alone — no q/k permutation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from astrai.errors import CheckpointError
from astrai.jsonfile import read_json_object
from astrai.model.checkpoint import (
    CONFIG,
    TOKENIZER_FILES,
    WEIGHTS,
    check_config_shapes,
    check_state_dict,
    header_shapes,
    load_checkpoint,
    read_safetensors,
    weight_shapes,
)
from astrai.model.config import ModelConfig
from astrai.model.gguf_file import is_gguf
from astrai.model.hf_config import config_from_hf, is_hf_config
from astrai.model.hf_names import hf_to_astrai_name
from astrai.model.transformer import Transformer

INDEX = "model.safetensors.index.json"
HF_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
EXPECTED = ("an astrai checkpoint (config.json + model.safetensors, e.g. RUN/checkpoints/"
            "step_N), a Hugging Face model directory (config.json + *.safetensors) or a "
            ".gguf file")
HF_TOKENIZER_FILES = TOKENIZER_FILES + (
    "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
)

# -- reading ------------------------------------------------------------------------------

def read_config(path: str | Path) -> tuple[ModelConfig, dict[str, Any]]:
    """(ModelConfig, info) of a checkpoint directory of either format, or of a GGUF file
    (astrai.model.gguf_load), without weights."""
    path = Path(path)
    if is_gguf(path):
        from astrai.model.gguf_load import read_gguf_config

        return read_gguf_config(path)
    f = path / CONFIG
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory; pass a checkpoint directory")
    if not f.is_file():
        raise CheckpointError(f"{path}: not a checkpoint (no {CONFIG}); expected {EXPECTED}")
    data = read_json_object(f, CheckpointError)
    if not is_hf_config(data):
        config = ModelConfig.from_dict(data, source=str(f))
        shapes = weight_shapes(path)  # model.safetensors' header or the DCP metadata
        if shapes is not None:
            check_config_shapes(config, shapes, str(f))
        return config, {"format": "astrai"}
    config, notes = config_from_hf(data, source=str(f))
    try:
        files = hf_weight_files(path)
    except CheckpointError:  # no weights: the loader says so when it needs them
        files = []
    _check_against_header(config, files, str(f), hf_to_astrai_name)
    info = {"format": "hf", "model_type": data["model_type"],
            "architectures": data.get("architectures"), "notes": notes}
    return config, info


def _check_against_header(config: ModelConfig, files: list[Path], source: str,
                          rename: Any) -> None:
    """The config against the shapes in the weights' headers (no tensor data read): a
    config claiming more blocks or experts than the weights hold is refused before anything
    is built or reported from it (checkpoint.check_config_shapes)."""
    if not files:
        return  # no weights here: the loader says so when it needs them
    shapes = {}
    for name, shape in header_shapes(files).items():
        ours = rename(name)
        if ours is not None:
            shapes[ours] = shape
    check_config_shapes(config, shapes, source)


def hf_weight_files(path: Path) -> list[Path]:
    """The safetensors files of a HF directory: model.safetensors, or the shards its index names."""
    if (path / WEIGHTS).is_file():
        return [path / WEIGHTS]
    if (path / INDEX).is_file():
        weight_map = read_json_object(path / INDEX, CheckpointError).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{path / INDEX}: no 'weight_map' object")
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not (path / n).is_file()]
        if missing:
            raise CheckpointError(
                f"{path}: shards named in {INDEX} are missing: {', '.join(missing)}"
            )
        return [path / n for n in names]
    shards = sorted(path.glob("*.safetensors"))
    if shards:
        return shards
    other = [p.name for p in path.glob("*.bin")] + [p.name for p in path.glob("*.pt")]
    hint = ""
    if other:
        hint = (f" (found {', '.join(sorted(other))}: astrai reads weights only from "
                "safetensors; convert with transformers' save_pretrained(safe_serialization=True))")
    raise CheckpointError(f"{path}: no {WEIGHTS} or {INDEX}{hint}")


def _target_dtype(state: dict[str, torch.Tensor], hf: dict) -> torch.dtype:
    dtypes = {t.dtype for t in state.values() if t.is_floating_point()}
    if len(dtypes) == 1:
        return dtypes.pop()
    return HF_DTYPES.get(str(hf.get("dtype") or hf.get("torch_dtype")), torch.float32)


def load_pretrained(path: str | Path, device: str | torch.device = "cpu",
                    dtype: torch.dtype | None = None, *, max_seq_len: int | None = None,
                    ) -> tuple[Transformer, ModelConfig, dict[str, Any]]:
    """(model in eval mode, config, meta_or_info) from an astrai checkpoint, a HF directory
    or a GGUF file (astrai.model.gguf_load, whose info has format "gguf").

    astrai directories return their meta.json; HF directories return
    {"format": "hf", "model_type", "architectures", "notes"}. `dtype` None keeps the stored
    dtype; `max_seq_len` overrides the RoPE table length (HF max_position_embeddings).
    """
    path = Path(path)
    if is_gguf(path):
        from astrai.model.gguf_load import load_gguf

        return load_gguf(path, device, dtype, max_seq_len=max_seq_len)
    config, info = read_config(path)
    if info["format"] == "astrai":
        if max_seq_len is None:
            return load_checkpoint(path, device=device, dtype=dtype)
        model, config, meta = load_checkpoint(path, device="cpu", dtype=dtype)
        return _with_max_len(model, config, max_seq_len).to(device), model.config, meta
    if max_seq_len is not None:
        config = config.model_copy(update={"max_seq_len": max_seq_len})
    hf = read_json_object(path / CONFIG, CheckpointError)
    raw = read_safetensors(hf_weight_files(path))
    state: dict[str, torch.Tensor] = {}
    for name, tensor in raw.items():
        ours = hf_to_astrai_name(name)
        if ours is None or (ours == "lm_head.weight" and config.tie_embeddings):
            continue  # recomputed RoPE buffer, or a tied head some exporters store twice
        state[ours] = tensor
    dtype = dtype or _target_dtype(state, hf)
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    with torch.device("meta"):
        model = Transformer(config)
    check_state_dict(model, state, str(path))
    model.load_state_dict(state, assign=True)
    model.reset_rope("cpu")
    return model.to(device).eval(), config, info


def _with_max_len(model: Transformer, config: ModelConfig, max_seq_len: int) -> Transformer:
    model.config = config.model_copy(update={"max_seq_len": max_seq_len})
    model.reset_rope("cpu")
    return model
