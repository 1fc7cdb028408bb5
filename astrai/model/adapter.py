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
import math
import reprlib
import shutil
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch import nn

from astrai.errors import CheckpointError, ConfigError
from astrai.jsonfile import read_json_object
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
MAX_CONFIG_BYTES = 1 << 20
"""Largest adapter_config.json read (PEFT writes well under 4 KiB)."""
MAX_PATH_CHARS = 4096
"""Longest adapter path taken: Linux's PATH_MAX."""
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 2, 40, 40
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
    load (another PEFT method, DoRA, biases, per-layer ranks, regex targets) and for a
    value of the wrong type or out of range, naming the file and the key."""
    cfg_file = adapter_file(path, ADAPTER_CONFIG)
    try:
        if cfg_file.stat().st_size > MAX_CONFIG_BYTES:
            raise CheckpointError(f"{cfg_file}: larger than {MAX_CONFIG_BYTES} bytes; a PEFT "
                                  "adapter_config.json is a few hundred")
        cfg = read_json_object(cfg_file, CheckpointError)
    except RecursionError:  # json's decoder recurses per nesting level
        raise CheckpointError(f"{cfg_file}: nested too deeply to be an adapter "
                              "config") from None
    except OSError as e:
        raise CheckpointError(f"{cfg_file}: unreadable ({e.strerror})") from None
    if cfg.get("peft_type", "LORA") != "LORA":
        raise CheckpointError(f"{cfg_file}: peft_type {_short(cfg['peft_type'])}; astrai "
                              "loads LORA adapters")
    for key, default in _UNSUPPORTED.items():
        if cfg.get(key, default) not in (default, None, [], {}, False, "none"):
            raise CheckpointError(f"{cfg_file}: {key}={_short(cfg[key])} is not supported by "
                                  f"astrai's LoRA; only plain LoRA adapters load "
                                  f"({key}={default!r})")
    rslora = cfg.get("use_rslora", False)
    if not isinstance(rslora, bool):
        _bad(cfg_file, "use_rslora", rslora, "true or false")
    return LoraSpec(rank=_rank(cfg_file, cfg), alpha=_alpha(cfg_file, cfg),
                    dropout=_dropout(cfg_file, cfg), targets=_targets(cfg_file, cfg),
                    rslora=rslora)


def adapter_file(path: str | Path, name: str) -> Path:
    """`path/name`, a file that exists; CheckpointError when it does not or when `path`
    cannot name a directory at all (too long, not text a file system takes)."""
    path = Path(path)
    text = str(path)
    if len(text) > MAX_PATH_CHARS:
        raise CheckpointError(f"adapter path of {len(text)} characters: the longest a file "
                              f"system takes is {MAX_PATH_CHARS}; give a PEFT LoRA adapter "
                              "directory")
    try:
        found = (path / name).is_file()
    except (OSError, ValueError) as e:  # ENAMETOOLONG, an embedded NUL byte
        why = getattr(e, "strerror", None) or e  # not str(e): it repeats the whole path
        raise CheckpointError(f"{_short(text)}: not a usable path ({why}); give a PEFT "
                              "LoRA adapter directory") from None
    if not found:
        what = ("--adapter takes a PEFT LoRA adapter directory (adapter_config.json + "
                "adapter_model.safetensors)" if name == ADAPTER_CONFIG
                else "astrai reads adapter weights only from safetensors")
        raise CheckpointError(f"{path}: no {name}; {what}")
    return path / name


def _short(value: Any) -> str:
    """A bounded repr of a value read from a file (deep or long values are cut)."""
    return _REPR.repr(value)


def _bad(cfg_file: Path, key: str, value: Any, want: str) -> NoReturn:
    raise CheckpointError(f"{cfg_file}: {key}: {_short(value)} is not valid; give {want}")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _rank(cfg_file: Path, cfg: dict[str, Any]) -> int:
    """`r`: a positive integer (8.0 is 8; 8.7 or "8" is refused, never rounded)."""
    if "r" not in cfg:
        raise CheckpointError(f"{cfg_file}: no `r` (the LoRA rank)")
    r = cfg["r"]
    if _number(r) and math.isfinite(r) and r == int(r) and r >= 1:
        return int(r)
    _bad(cfg_file, "r", r, "the LoRA rank as a positive integer")


def _alpha(cfg_file: Path, cfg: dict[str, Any]) -> float:
    """`lora_alpha`: a finite number (PEFT's default 8); the update is scaled by it."""
    alpha = cfg.get("lora_alpha", 8)
    if _number(alpha) and math.isfinite(alpha):
        return float(alpha)
    _bad(cfg_file, "lora_alpha", alpha, "a finite number")


def _dropout(cfg_file: Path, cfg: dict[str, Any]) -> float:
    dropout = cfg.get("lora_dropout", 0.0)
    if dropout is None:
        return 0.0
    if _number(dropout) and 0 <= dropout < 1:
        return float(dropout)
    _bad(cfg_file, "lora_dropout", dropout, "a number in [0, 1)")


def _targets(cfg_file: Path, cfg: dict[str, Any]) -> tuple[str, ...]:
    """`target_modules`: `all-linear`, one module name, or a list of them (never a regex)."""
    targets = cfg.get("target_modules")
    if isinstance(targets, str):
        if targets != ALL_LINEAR and ("." in targets or "|" in targets):
            _bad(cfg_file, "target_modules", targets,
                 "a list of module names (regex targets are not supported)")
        targets = [targets]
    if (not isinstance(targets, list) or not targets
            or not all(isinstance(t, str) for t in targets)):
        _bad(cfg_file, "target_modules", targets, "a list of module names such as "
             "[\"q_proj\", \"v_proj\"] (regex targets are not supported)")
    try:
        return resolve_targets(targets, field=f"{cfg_file}: target_modules")
    except ConfigError as e:
        raise CheckpointError(str(e)) from None


def read_adapter_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The adapter tensors of a PEFT directory under astrai names; a tensor holding NaN or
    Inf, or not floating point, is refused (a non-finite update poisons every token it
    touches)."""
    file = adapter_file(path, ADAPTER_WEIGHTS)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in read_safetensors([file]).items():
        ours = from_peft_name(name)
        if ours is None:
            raise CheckpointError(f"{file}: tensor '{_short(name)}' is not a LoRA weight of a "
                                  "decoder layer; astrai cannot load it")
        if not tensor.is_floating_point():
            raise CheckpointError(f"{file}: tensor '{name}' is {tensor.dtype}; LoRA weights "
                                  "are floating point")
        if not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(f"{file}: tensor '{name}' holds NaN or Inf; re-export the "
                                  "adapter from a run whose weights are finite")
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
