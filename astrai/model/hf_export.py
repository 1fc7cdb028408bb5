"""Export an astrai checkpoint as a Hugging Face Llama / Qwen2 / Qwen3 / Mistral directory.

config.json (with the tokenizer's special ids), model.safetensors in HF's names,
generation_config.json (every id that ends a reply) and the tokenizer files, which are
copied and read as files (astrai.model.tokenizer_files): the model room never loads the
tokenizers library (docs/architecture.md "Order of rooms").
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from astrai import __version__
from astrai.diskfull import writing
from astrai.errors import CheckpointError, UnsupportedModelError
from astrai.model.checkpoint import CONFIG, WEIGHTS, save_weights
from astrai.model.hf import HF_DTYPES, HF_TOKENIZER_FILES, load_pretrained, read_config
from astrai.model.hf_config import config_to_hf
from astrai.model.hf_names import astrai_to_hf_name
from astrai.model.tokenizer_files import special_token_ids, stop_token_ids


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
    with writing(out_dir), export_output(out_dir, checkpoint) as tmp:
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
    for name, d in HF_DTYPES.items():
        if d == dtype:
            return name
    raise UnsupportedModelError(
        f"dtype {dtype} cannot be exported; use float32, bfloat16 or float16"
    )
