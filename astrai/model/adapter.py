"""LoRA adapters on disk in PEFT's format, so `PeftModel.from_pretrained(base, DIR)` loads
what astrai trains and astrai loads what PEFT trains (PEFT docs, "LoRA" and
"Checkpoint format"):

    DIR/adapter_config.json        peft_type LORA, task_type CAUSAL_LM, r, lora_alpha,
                                   lora_dropout, target_modules, base_model_name_or_path
    DIR/adapter_model.safetensors  base_model.model.<HF module>.lora_A.weight [r, in]
                                   base_model.model.<HF module>.lora_B.weight [out, r]

HF module names come from astrai.model.hf_names (the only place that knows them):
`layers.0.attn.q_proj` here is `model.layers.0.self_attn.q_proj` there.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from astrai.errors import CheckpointError, ConfigError
from astrai.model.checkpoint import read_safetensors, save_weights
from astrai.model.hf_names import astrai_to_hf_name, hf_to_astrai_name
from astrai.model.lora import (
    ALL_LINEAR,
    LoraSpec,
    apply_lora,
    lora_state_dict,
    resolve_targets,
)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."
# PEFT options astrai does not implement: a file setting one is refused, not half-loaded.
_UNSUPPORTED = {"use_dora": False, "bias": "none", "fan_in_fan_out": False,
                "modules_to_save": None, "layers_to_transform": None, "rank_pattern": {},
                "alpha_pattern": {}, "lora_bias": False}


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def to_peft_name(name: str) -> str:
    """`layers.0.attn.q_proj.lora_A.weight` -> `base_model.model.model.layers.0.self_attn.
    q_proj.lora_A.weight`."""
    module, _, rest = name.partition(".lora_")
    return PREFIX + astrai_to_hf_name(module + ".weight").removesuffix(".weight") + ".lora_" + rest


def from_peft_name(name: str) -> str | None:
    """The inverse of to_peft_name (also with PEFT's adapter name `.default.` inside);
    None for a key that is not a LoRA tensor."""
    name = name.replace(".default.", ".")
    if not name.startswith(PREFIX) or ".lora_" not in name:
        return None
    module, _, rest = name[len(PREFIX):].partition(".lora_")
    ours = hf_to_astrai_name(module + ".weight")
    return None if ours is None else ours.removesuffix(".weight") + ".lora_" + rest


def adapter_config(spec: LoraSpec, base_model: str | None) -> dict[str, Any]:
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
        "r": spec.rank, "lora_alpha": spec.alpha, "lora_dropout": spec.dropout,
        "target_modules": list(spec.targets), "use_rslora": spec.rslora,
        "init_lora_weights": True, "inference_mode": True, **_UNSUPPORTED,
    }


def write_adapter(out_dir: str | Path, model: nn.Module, spec: LoraSpec,
                  base_model: str | None,
                  state: dict[str, torch.Tensor] | None = None) -> Path:
    """Write the two PEFT files into `out_dir` (created; the caller makes it atomic).
    `state`: the model's adapter tensors when already gathered (astrai names)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = lora_state_dict(model) if state is None else state
    tensors = {to_peft_name(k): v.detach().cpu().contiguous() for k, v in state.items()}
    (out / ADAPTER_CONFIG).write_text(json.dumps(adapter_config(spec, base_model), indent=2)
                                      + "\n")
    save_weights(tensors, out / ADAPTER_WEIGHTS)
    return out


def read_adapter_spec(path: str | Path) -> LoraSpec:
    """The LoraSpec of a PEFT adapter directory; a one-line error for what astrai cannot
    load (another PEFT method, DoRA, biases, per-layer ranks, regex targets)."""
    path = Path(path)
    cfg_file = path / ADAPTER_CONFIG
    if not cfg_file.is_file():
        raise CheckpointError(f"{path}: no {ADAPTER_CONFIG}; --adapter takes a PEFT LoRA "
                              "adapter directory (adapter_config.json + "
                              "adapter_model.safetensors)")
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfg_file}: line {e.lineno}: invalid JSON ({e.msg})") from None
    if not isinstance(cfg, dict) or cfg.get("peft_type", "LORA") != "LORA":
        kind = cfg.get("peft_type") if isinstance(cfg, dict) else type(cfg).__name__
        raise CheckpointError(f"{cfg_file}: peft_type {kind!r}; astrai loads LORA adapters")
    for key, default in _UNSUPPORTED.items():
        if cfg.get(key, default) not in (default, None, [], {}, False, "none"):
            raise CheckpointError(f"{cfg_file}: {key}={cfg[key]!r} is not supported by astrai's "
                                  f"LoRA; only plain LoRA adapters load ({key}={default!r})")
    targets = cfg.get("target_modules")
    if isinstance(targets, str) and targets != ALL_LINEAR:
        targets = [targets] if "." not in targets and "|" not in targets else None
    if not targets:
        raise CheckpointError(f"{cfg_file}: target_modules {cfg.get('target_modules')!r}: "
                              "astrai needs a list of module names (regex targets are not "
                              "supported)")
    try:
        return LoraSpec(rank=int(cfg["r"]), alpha=float(cfg.get("lora_alpha", 8)),
                        dropout=float(cfg.get("lora_dropout", 0.0)),
                        targets=resolve_targets([targets] if isinstance(targets, str)
                                                else targets,
                                                field=f"{cfg_file}: target_modules"),
                        rslora=bool(cfg.get("use_rslora", False)))
    except KeyError:
        raise CheckpointError(f"{cfg_file}: no `r` (the LoRA rank)") from None
    except ConfigError as e:
        raise CheckpointError(str(e)) from None


def read_adapter_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The adapter tensors of a PEFT directory under astrai names."""
    path = Path(path)
    file = path / ADAPTER_WEIGHTS
    if not file.is_file():
        raise CheckpointError(f"{path}: no {ADAPTER_WEIGHTS} (astrai reads adapter weights "
                              "only from safetensors)")
    out: dict[str, torch.Tensor] = {}
    for name, tensor in read_safetensors([file]).items():
        ours = from_peft_name(name)
        if ours is None:
            raise CheckpointError(f"{file}: tensor '{name}' is not a LoRA weight of a "
                                  "decoder layer; astrai cannot load it")
        out[ours] = tensor
    return out


def check_fit(path: str | Path, missing: list[str], extra: list[str],
              shapes: list[str]) -> None:
    """Raise one CheckpointError naming every missing, unexpected or mis-shaped tensor of
    an adapter that does not fit the model (nothing when all three lists are empty)."""
    if missing or extra or shapes:
        parts = [f"{what}: {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}"
                 for what, names in (("missing", missing), ("unexpected", extra),
                                     ("wrong shape", shapes)) if names]
        raise CheckpointError(f"{Path(path) / ADAPTER_WEIGHTS}: does not fit this model "
                              f"({'; '.join(parts)}); was it trained on another base?")


def load_adapter(model: nn.Module, path: str | Path, *, seed: int = 0,
                 train_also: tuple[str, ...] = ()) -> LoraSpec:
    """Put the adapter of PEFT directory `path` on `model` (in place): apply_lora with the
    directory's spec, then its weights (fp32). Every missing, unexpected or mis-shaped
    tensor is named in one error."""
    spec = read_adapter_spec(path)
    state = read_adapter_weights(path)
    apply_lora(model, spec, seed=seed, train_also=train_also)
    mine = lora_state_dict(model)
    missing = sorted(set(mine) - set(state))
    extra = sorted(set(state) - set(mine))
    shapes = sorted(k for k in set(mine) & set(state) if mine[k].shape != state[k].shape)
    check_fit(path, missing, extra, shapes)
    with torch.no_grad():
        params = dict(model.named_parameters())
        for k, v in state.items():
            params[k].copy_(v.to(torch.float32))
    return spec


def find_adapter(checkpoint: str | Path, adapter: str | Path | None = None) -> Path | None:
    """The adapter to put on `checkpoint`: `adapter` when given (checked), else the
    checkpoint's own `adapter/` (a LoRA run's training checkpoint), else None."""
    if adapter is not None:
        read_adapter_spec(adapter)
        return Path(adapter)
    own = Path(checkpoint) / "adapter"
    return own if is_adapter_dir(own) else None


def copy_adapter(src: str | Path, dst: str | Path, base_model: str) -> Path:
    """The adapter `src` copied into `dst` (its two PEFT files), its
    `base_model_name_or_path` naming `base_model`: PEFT's AutoPeftModelForCausalLM loads the
    base from there, so an exported adapter names the exported base (an absolute path; PEFT
    reads a relative one as a Hub id)."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True)
    conf = json.loads((src / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    conf["base_model_name_or_path"] = base_model
    (dst / ADAPTER_CONFIG).write_text(json.dumps(conf, indent=2) + "\n", encoding="utf-8")
    shutil.copy2(src / ADAPTER_WEIGHTS, dst / ADAPTER_WEIGHTS)
    return dst


def merge_adapter(model: nn.Module, adapter: str | Path) -> nn.Module:
    """`model` with the adapter folded into its weights (W + s·B A): a plain model that
    serves at the base's speed. In place; returns the model."""
    from astrai.model.lora import merge_lora

    training = model.training
    load_adapter(model, adapter)
    return merge_lora(model).train(training).requires_grad_(False)
