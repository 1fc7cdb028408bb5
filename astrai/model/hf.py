"""Hugging Face interop at the boundary: load Llama / Qwen2 / Qwen3 / Mistral directories,
export to them.

`load_pretrained` accepts an astrai checkpoint directory or a HF-format directory
(config.json + model.safetensors, or shards + model.safetensors.index.json). Weights only
ever come from safetensors; nothing downloads; transformers is never imported and no remote
code runs. Tokenizer files stay where they are for the tokenizer loader.

HF's Llama family uses the same rotate-half RoPE layout as astrai, so weights map by name
alone — no q/k permutation.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from astrai import __version__
from astrai.errors import CheckpointError, ConfigError, UnsupportedModelError
from astrai.jsonfile import read_json_object
from astrai.model.checkpoint import (
    CONFIG,
    TOKENIZER_FILES,
    WEIGHTS,
    check_state_dict,
    load_checkpoint,
    read_safetensors,
    save_weights,
)
from astrai.model.config import ModelConfig
from astrai.model.hf_config import config_from_hf, config_to_hf, is_hf_config
from astrai.model.hf_names import astrai_to_hf_name, hf_to_astrai_name
from astrai.model.transformer import Transformer

INDEX = "model.safetensors.index.json"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
EXPECTED = ("an astrai checkpoint (config.json + model.safetensors, e.g. RUN/checkpoints/"
            "step_N) or a Hugging Face model directory (config.json + *.safetensors)")
HF_TOKENIZER_FILES = TOKENIZER_FILES + (
    "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
)

# -- reading ------------------------------------------------------------------------------

def read_config(path: str | Path) -> tuple[ModelConfig, dict[str, Any]]:
    """(ModelConfig, info) of a checkpoint directory of either format, without weights."""
    path = Path(path)
    f = path / CONFIG
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory; pass a checkpoint directory")
    if not f.is_file():
        raise CheckpointError(f"{path}: not a checkpoint (no {CONFIG}); expected {EXPECTED}")
    data = read_json_object(f, CheckpointError)
    if not is_hf_config(data):
        return ModelConfig.from_dict(data, source=str(f)), {"format": "astrai"}
    config, notes = config_from_hf(data, source=str(f))
    info = {"format": "hf", "model_type": data["model_type"],
            "architectures": data.get("architectures"), "notes": notes}
    return config, info


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
    return _DTYPES.get(str(hf.get("dtype") or hf.get("torch_dtype")), torch.float32)


def load_pretrained(path: str | Path, device: str | torch.device = "cpu",
                    dtype: torch.dtype | None = None, *, max_seq_len: int | None = None,
                    ) -> tuple[Transformer, ModelConfig, dict[str, Any]]:
    """(model in eval mode, config, meta_or_info) from an astrai checkpoint or a HF directory.

    astrai directories return their meta.json; HF directories return
    {"format": "hf", "model_type", "architectures", "notes"}. `dtype` None keeps the stored
    dtype; `max_seq_len` overrides the RoPE table length (HF max_position_embeddings).
    """
    path = Path(path)
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


# -- export -------------------------------------------------------------------------------

def export_hf(checkpoint: str | Path, out_dir: str | Path, *, dtype: torch.dtype | None = None,
              overwrite: bool = False, merge_lora: bool = False,
              adapter: str | Path | None = None) -> Path:
    """Write a HF-format directory (config.json, model.safetensors, generation_config.json and
    the tokenizer files) that transformers' AutoModelForCausalLM.from_pretrained loads.
    Written atomically, with the marker of astrai/model/export_output.py; an existing
    `out_dir` is replaced only with `overwrite`, and only when it is an earlier export.

    LoRA: the adapter is `adapter` or the checkpoint's own `adapter/`. `merge_lora` folds it
    into the weights (W + s·B A, PEFT's merge_and_unload); otherwise the base is written and
    the adapter copied to OUT_DIR/adapter, naming OUT_DIR as its base, for PeftModel and
    AutoPeftModelForCausalLM.from_pretrained."""
    from astrai.model.adapter import copy_adapter, find_adapter, merge_adapter
    from astrai.model.export_output import check_export_output, export_output

    checkpoint, out_dir = Path(checkpoint), Path(out_dir)
    config, info = read_config(checkpoint)
    dtype_name = None if dtype is None else _dtype_name(dtype)
    config_to_hf(config)  # refuse MoE before reading any weights
    if out_dir.resolve() == checkpoint.resolve():
        raise CheckpointError(f"{out_dir}: is the checkpoint itself; choose another OUT_DIR")
    check_export_output(out_dir, overwrite)
    lora = find_adapter(checkpoint, adapter)
    if merge_lora and lora is None:
        raise CheckpointError(f"{checkpoint}: no LoRA adapter to merge (no adapter/ inside); "
                              "pass --adapter DIR or drop --merge-lora")
    model, config, _ = load_pretrained(checkpoint, dtype=dtype)
    if merge_lora:
        merge_adapter(model, lora)
    state = {astrai_to_hf_name(k): v for k, v in model.state_dict().items()}
    dtype_name = dtype_name or _dtype_name(next(iter(state.values())).dtype)
    hf_config = config_to_hf(config, dtype_name, family=info.get("model_type"))
    special = special_token_ids(checkpoint)
    hf_config.update({k: v for k, v in special.items() if v is not None})
    with export_output(out_dir, checkpoint) as tmp:
        (tmp / CONFIG).write_text(json.dumps(hf_config, indent=2) + "\n")
        save_weights(state, tmp / WEIGHTS)
        gen = {"_from_model_config": True, "producer": f"astrai {__version__}",
               **{k: v for k, v in special.items() if v is not None}}
        stops = stop_token_ids(checkpoint)
        if len(stops) > 1:  # HF generate stops at any of them, as astrai chat does
            gen["eos_token_id"] = stops
        (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
        for name in HF_TOKENIZER_FILES:
            if (checkpoint / name).is_file():
                shutil.copy2(checkpoint / name, tmp / name)
        if (tmp / "tokenizer.json").is_file():
            _tokenizer_json_authoritative(tmp / "tokenizer_config.json")
        if lora is not None and not merge_lora:
            copy_adapter(lora, tmp / "adapter", str(out_dir.resolve()))
    return out_dir


def _tokenizer_json_authoritative(cfg_file: Path) -> None:
    """Make AutoTokenizer read tokenizer.json as it is, as astrai does: transformers 5 rebuilds
    the pipeline of some classes (LlamaTokenizer drops tokenizer.json's normalizer, so a
    Mistral tokenizer loses a leading ▁), and a missing class leaves it guessing."""
    cfg = json.loads(cfg_file.read_text(encoding="utf-8")) if cfg_file.is_file() else {}
    if not isinstance(cfg, dict):
        cfg = {}
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_file.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _dtype_name(dtype: torch.dtype) -> str:
    for name, d in _DTYPES.items():
        if d == dtype:
            return name
    raise UnsupportedModelError(
        f"dtype {dtype} cannot be exported; use float32, bfloat16 or float16"
    )


def stop_token_ids(path: Path) -> list[int]:
    """The ids that end a reply for the checkpoint's tokenizer (eos and the chat template's
    end-of-turn marker, e.g. <|im_end|>), eos first; [] without a tokenizer."""
    if not (path / "tokenizer.json").is_file():
        return []
    from astrai.data.tokenizer import Tokenizer

    try:
        return Tokenizer.load(path).stop_ids
    except ConfigError:  # a tokenizer.json the tokenizers library cannot read: eos alone
        return []


def special_token_ids(path: Path) -> dict[str, int | None]:
    """bos/eos/pad token ids named by tokenizer_config.json and resolved in tokenizer.json."""
    cfg_file, tok_file = path / "tokenizer_config.json", path / "tokenizer.json"
    if not (cfg_file.is_file() and tok_file.is_file()):
        return {}
    try:
        cfg, tok = json.loads(cfg_file.read_text()), json.loads(tok_file.read_text())
    except json.JSONDecodeError:
        return {}
    added = [t for t in tok.get("added_tokens", []) if isinstance(t, dict)]
    ids = {t.get("content"): t.get("id") for t in added}
    vocab = (tok.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        ids = {**vocab, **ids}
    out: dict[str, int | None] = {}
    for key in ("bos", "eos", "pad"):
        token = cfg.get(f"{key}_token")
        if isinstance(token, dict):
            token = token.get("content")
        if isinstance(token, str) and isinstance(ids.get(token), int):
            out[f"{key}_token_id"] = ids[token]
    return out
