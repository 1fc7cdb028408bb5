"""Load a GGUF file (llama.cpp, ollama, LM Studio) as an astrai Transformer.

`read_gguf_config` gives the config and what `astrai info` shows (architecture, tensor
types, metadata) without reading weights; `load_gguf` reads the tensors (gguf_weights:
floats as they are, quantized types dequantized), maps llama.cpp's names back to astrai's
(gguf_names.astrai_tensors, undoing the llama q/k row permutation) and builds the model as
`astrai.model.hf.load_pretrained` does for a HF directory. The tokenizer is
astrai.model.gguf_tokenizer's. A tied model is one without `output.weight` (llama.cpp then
projects with `token_embd.weight`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import torch

from astrai.model.checkpoint import check_state_dict
from astrai.model.config import ModelConfig
from astrai.model.gguf_file import GGUFFile, gguf_config, open_gguf
from astrai.model.gguf_names import astrai_tensors
from astrai.model.gguf_weights import FLOAT_TYPES, format_note, implied_quantize, tensor_values
from astrai.model.transformer import Transformer

SHOWN_KEYS = ("general.name", "general.basename", "general.size_label", "general.file_type",
              "general.quantization_version", "tokenizer.ggml.model", "tokenizer.ggml.pre")
"""Metadata `astrai info` prints (the rest is counted)."""


def read_gguf_config(path: str | Path) -> tuple[ModelConfig, dict[str, Any]]:
    """(ModelConfig, info) of a GGUF file without reading its weights; info holds
    format "gguf", model_type (llama.cpp's architecture), "gguf" (tensor types and
    metadata) and "notes" (the line saying which weights load dequantized)."""
    g = open_gguf(path)
    config = gguf_config(g)
    return config, _info(g, torch.float32)


def _info(g: GGUFFile, dtype: torch.dtype) -> dict[str, Any]:
    types = Counter(t.tensor_type.name for t in g.reader.tensors)
    shown = {k: g.value(k) for k in SHOWN_KEYS if g.value(k) is not None}
    template = g.value("tokenizer.chat_template")
    gguf = {"architecture": g.arch,
            "tensor_types": ", ".join(f"{n.lower()} x{c}" for n, c in sorted(types.items())),
            **shown, "chat_template": "yes" if isinstance(template, str) else "no",
            "metadata_keys": len([k for k in g.reader.fields if not k.startswith("GGUF.")])}
    note = format_note(g.path, set(types), dtype)
    return {"format": "gguf", "model_type": g.arch, "gguf": gguf,
            "notes": [note] if note else []}


def stored_dtype(g: GGUFFile) -> torch.dtype:
    """The dtype the weights are stored in: the embedding's float type, else float32."""
    embd = g.tensor_infos()["token_embd.weight"].tensor_type.name
    return FLOAT_TYPES.get(embd, torch.float32)


def load_gguf(path: str | Path, device: str | torch.device = "cpu",
              dtype: torch.dtype | None = None, *, max_seq_len: int | None = None,
              ) -> tuple[Transformer, ModelConfig, dict[str, Any]]:
    """(model in eval mode, config, info) from a GGUF file. `dtype` None keeps the stored
    float type (float32 for quantized files); `max_seq_len` overrides the RoPE table length
    ({arch}.context_length)."""
    g = open_gguf(path)
    config = gguf_config(g)
    if max_seq_len is not None:
        config = config.model_copy(update={"max_seq_len": max_seq_len})
    dtype = dtype or stored_dtype(g)
    raw = {name: tensor_values(g, info) for name, info in g.tensor_infos().items()}
    state = {k: v.to(dtype) for k, v in astrai_tensors(raw, config, g.arch, str(g.path)).items()}
    del raw
    with torch.device("meta"):
        model = Transformer(config)
    check_state_dict(model, state, str(g.path))
    model.load_state_dict(state, assign=True)
    model.reset_rope("cpu")
    return model.to(device).eval(), config, _info(g, dtype)


def gguf_quantize(path: str | Path) -> str | None:
    """astrai's weight format that holds GGUF file `path`'s quantized weights as they are
    (gguf_weights.implied_quantize: int4 for an all-q4_0 file), or None."""
    g = open_gguf(path)
    return implied_quantize({t.tensor_type.name for t in g.reader.tensors})


def gguf_notes(path: str | Path, training: bool = False) -> list[str]:
    """The lines a command prints before loading GGUF file `path`: which weights load
    dequantized; with `training`, that fine-tuning starts from the file's weights."""
    _, info = read_gguf_config(path)
    if not training:
        return list(info["notes"])
    quant = [t.split(" x")[0] for t in info["gguf"]["tensor_types"].split(", ")
             if t.split(" x")[0].upper() not in FLOAT_TYPES]
    how = (f"{', '.join(quant)} weights dequantized to float32" if quant
           else "its float weights as stored")
    line = (f"{path}: fine-tuning starts from this GGUF file, {how} (astrai trains float "
            "weights; `astrai export --format gguf` writes the result back)")
    return [line]
