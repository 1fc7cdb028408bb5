"""The self-contained checkpoint directory (docs/architecture.md "Checkpoint format").

    config.json          ModelConfig
    model.safetensors    weights (tied embeddings stored once); or, in a DCP checkpoint,
    dcp/                 torch.distributed.checkpoint shards of weights and optimizer state
                         written by every rank (astrai.model.dcp_format)
    tokenizer.json ...   tokenizer files (+ chat template), so chat needs nothing else
    meta.json            step, epoch, consumed_samples, timestamp, version, train config
    optimizer.pt, scheduler.pt, trainer_state.pt   (training runs; loaded weights_only=True)

Writes go to a temporary sibling directory that is renamed into place, so a crash never
leaves a half checkpoint that looks complete.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from astrai import __version__
from astrai.atomic import atomic_dir
from astrai.diskfull import writing
from astrai.errors import CheckpointError
from astrai.jsonfile import read_json_object
from astrai.model.config import ModelConfig
from astrai.model.dcp_format import is_dcp, read_tensors, tensor_shapes
from astrai.model.transformer import Transformer
from astrai.tempdir import follow_umask

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
META = "meta.json"
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
)


def save_weights(state_dict: dict[str, torch.Tensor], path: str | Path) -> None:
    tensors = {k: v.detach().contiguous().cpu() for k, v in state_dict.items()}
    # One metadata key only: safetensors stores metadata in a hash map whose order varies
    # between writes, and equal weights must give byte-identical files (exact resume is
    # checked by comparing them). The producer version lives in meta.json.
    save_file(tensors, str(path), metadata={"format": "pt"})
    follow_umask(path)  # safetensors creates the file private (0600)


def copy_tokenizer(src: str | Path, dst: str | Path) -> None:
    """Copy the tokenizer files present in `src` into `dst`."""
    for name in TOKENIZER_FILES:
        f = Path(src) / name
        if f.is_file():
            shutil.copy2(f, Path(dst) / name)


def save_checkpoint(
    path: str | Path,
    model: Transformer | dict[str, torch.Tensor],
    config: ModelConfig,
    *,
    tokenizer_dir: str | Path | None = None,
    meta: dict[str, Any] | None = None,
    extras: dict[str, Any] | None = None,
    write_more: Callable[[Path], None] | None = None,
) -> Path:
    """Write a complete checkpoint directory atomically. `extras` maps name -> object for
    `{name}.pt` files (optimizer, scheduler, trainer_state); `write_more(tmp)` adds files
    inside the directory before it appears (a LoRA run's adapter/)."""
    state = model.state_dict() if isinstance(model, torch.nn.Module) else model
    with writing(path), atomic_dir(path) as tmp:
        save_weights(state, tmp / WEIGHTS)
        write_checkpoint_files(tmp, config, tokenizer_dir=tokenizer_dir, meta=meta,
                               extras=extras)
        if write_more is not None:
            write_more(tmp)
    return Path(path)


def write_checkpoint_files(directory: Path, config: ModelConfig, *,
                           tokenizer_dir: str | Path | None = None,
                           meta: dict[str, Any] | None = None,
                           extras: dict[str, Any] | None = None) -> None:
    """Everything of a checkpoint but its weights, into `directory`: config.json, the
    tokenizer, meta.json (with version and timestamp) and the `{name}.pt` extras."""
    config.save(directory / CONFIG)
    if tokenizer_dir is not None:
        copy_tokenizer(tokenizer_dir, directory)
    full_meta = {"version": __version__, "timestamp": time.time(), **(meta or {})}
    (directory / META).write_text(json.dumps(full_meta, indent=2, default=str) + "\n")
    for name, obj in (extras or {}).items():
        torch.save(obj, directory / f"{name}.pt")


def read_meta(path: str | Path) -> dict[str, Any]:
    f = Path(path) / META
    if not f.is_file():
        return {}
    return read_json_object(f, CheckpointError)


def load_extra(path: str | Path, name: str) -> Any:
    """Load `{name}.pt` with weights_only=True (no arbitrary code), or None if absent."""
    f = Path(path) / f"{name}.pt"
    if not f.is_file():
        return None
    return torch.load(f, map_location="cpu", weights_only=True)


def read_safetensors(files: list[Path]) -> dict[str, torch.Tensor]:
    """All tensors of one or more safetensors files; a corrupt file is a CheckpointError."""
    out: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as fh:
                for key in fh.keys():  # noqa: SIM118 (safe_open is not iterable)
                    out[key] = fh.get_tensor(key)
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise CheckpointError(
                f"{f}: not a readable safetensors file ({e}); re-export or re-download it"
            ) from None
    return out


def header_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape from the safetensors headers alone (no tensor data read); a
    corrupt file is a CheckpointError."""
    out: dict[str, tuple[int, ...]] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as fh:
                for key in fh.keys():  # noqa: SIM118 (safe_open is not iterable)
                    out[key] = tuple(fh.get_slice(key).get_shape())
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise CheckpointError(
                f"{f}: not a readable safetensors file ({e}); re-export or re-download it"
            ) from None
    return out


def check_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """One error listing every missing, unexpected or mis-shaped tensor."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    misshaped = [
        f"{k} {tuple(state[k].shape)} (expected {expected[k]})"
        for k in sorted(set(expected) & set(state)) if tuple(state[k].shape) != expected[k]
    ]
    problems = []
    if missing:
        problems.append(f"missing {_few(missing)}")
    if unexpected:
        problems.append(f"unexpected {_few(unexpected)}")
    if misshaped:
        problems.append(f"mis-shaped {_few(misshaped)}")
    if problems:
        raise CheckpointError(
            f"{source}: weights do not match config.json: {'; '.join(problems)}"
        )


_BLOCK = re.compile(r"^layers\.(\d+)\.")
_EXPERT = re.compile(r"^layers\.(\d+)\.mlp\.experts\.(\d+)\.")


def check_config_shapes(config: ModelConfig, shapes: dict[str, tuple[int, ...]],
                        source: str) -> None:
    """config.json against the weights before a model is built from it: the blocks, the
    experts and the embedding the weights hold must be the ones the config describes (a
    config claiming 10^9 layers, or experts, over a small file is refused here, in one line,
    instead of building them). Names are astrai's (HF names mapped first)."""
    blocks = {int(m.group(1)) for k in shapes if (m := _BLOCK.match(k))}
    if len(blocks) != config.n_layers:
        raise CheckpointError(f"{source}: config.json says n_layers {config.n_layers} but the "
                              f"weights hold {len(blocks)} blocks; fix config.json")
    experts = {int(m.group(2)) for k in shapes if (m := _EXPERT.match(k))}
    if len(experts) != config.n_experts:
        raise CheckpointError(f"{source}: config.json says n_experts {config.n_experts} but "
                              f"the weights hold {len(experts)} experts; fix config.json")
    embed = shapes.get("embed_tokens.weight")
    if embed is not None and embed != (config.vocab_size, config.dim):
        raise CheckpointError(f"{source}: config.json says vocab_size {config.vocab_size} and "
                              f"dim {config.dim} but embed_tokens.weight is {list(embed)}; fix "
                              "config.json")


def _few(items: list[str], n: int = 8) -> str:
    head = ", ".join(items[:n])
    return head + (f" and {len(items) - n} more" if len(items) > n else "")


def has_weights(path: Path) -> bool:
    """Whether checkpoint directory `path` holds weights: model.safetensors, or DCP shards."""
    return (path / WEIGHTS).is_file() or is_dcp(path)


def read_weights(path: str | Path) -> tuple[dict[str, torch.Tensor], str]:
    """(every weight of checkpoint directory `path`, the file or directory they came from):
    model.safetensors, or a DCP checkpoint's shards assembled in this process. The one
    place a checkpoint's weights are read, whichever format wrote them."""
    path = Path(path)
    if not (path / WEIGHTS).is_file() and is_dcp(path):
        return read_tensors(path), str(path / "dcp")
    return read_safetensors([path / WEIGHTS]), str(path / WEIGHTS)


def weight_shapes(path: str | Path) -> dict[str, tuple[int, ...]] | None:
    """Every weight's shape from the headers or the DCP metadata (no tensor data read);
    None when `path` holds no weights."""
    path = Path(path)
    if (path / WEIGHTS).is_file():
        return header_shapes([path / WEIGHTS])
    return tensor_shapes(path) if is_dcp(path) else None


def require_checkpoint_dir(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory; pass a checkpoint directory")
    missing = [n for n in (CONFIG,) if not (path / n).is_file()]
    if not has_weights(path):
        missing.append(f"{WEIGHTS} (or dcp/.metadata)")
    if missing:
        raise CheckpointError(
            f"{path}: not a complete checkpoint, missing {', '.join(missing)}"
        )
    return path


def run_checkpoints(run_dir: str | Path) -> list[Path]:
    """Every checkpoint of a training run directory, oldest first: each RUN/checkpoints/
    step_N holding config.json and weights (either format; [] when there are none)."""
    ckpts = Path(run_dir) / "checkpoints"
    found = []
    if ckpts.is_dir():
        for p in ckpts.iterdir():
            step = p.name.removeprefix("step_")
            if step.isdigit() and (p / CONFIG).is_file() and has_weights(p):
                found.append((int(step), p))
    return [p for _, p in sorted(found)]


def newest_in_run(run_dir: str | Path) -> Path | None:
    """The newest checkpoint of a training run directory: the highest RUN/checkpoints/step_N
    holding config.json and model.safetensors (else the one RUN/latest names), or None when
    `run_dir` holds none."""
    run_dir = Path(run_dir)
    found = run_checkpoints(run_dir)
    if found:
        return found[-1]
    pointer = run_dir / "latest"
    if pointer.is_file():
        target = run_dir / pointer.read_text().strip()
        if (target / CONFIG).is_file() and has_weights(target):
            return target
    return None


def resolve_checkpoint(path: str | Path) -> tuple[Path, str | None]:
    """(checkpoint directory, note): a training run directory stands for its newest
    checkpoint, and the note says which; any other path is returned as it is (None)."""
    path = Path(path)
    if not path.is_dir() or (path / CONFIG).is_file():
        return path, None
    ckpt = newest_in_run(path)
    if ckpt is not None:
        return ckpt, f"{path} is a run directory: using its newest checkpoint {ckpt}"
    if (path / "checkpoints").is_dir() or (path / "train_config.json").is_file():
        raise CheckpointError(f"{path}: a run directory with no complete checkpoint yet; "
                              "pass a checkpoint directory (RUN/checkpoints/step_N)")
    return path, None


def model_class(state: dict[str, Any]) -> type[Transformer]:
    """Transformer, or RewardModel when the weights (names -> tensors or shapes) carry a
    scalar score head."""
    if "score_head.weight" in state:
        from astrai.model.reward_head import RewardModel

        return RewardModel
    return Transformer


def load_checkpoint(path: str | Path, *, device: str | torch.device = "cpu",
                    dtype: torch.dtype | None = None) -> tuple[Transformer, ModelConfig, dict]:
    """(model in eval mode, config, meta) from an astrai checkpoint directory, either
    format (read_weights)."""
    path = require_checkpoint_dir(path)
    config = ModelConfig.load(path / CONFIG)
    state, source = read_weights(path)
    check_config_shapes(config, {k: tuple(v.shape) for k, v in state.items()}, source)
    with torch.device("meta"):
        model = model_class(state)(config)
    check_state_dict(model, state, source)
    model.load_state_dict(state, assign=True)
    model.reset_rope("cpu")
    model = model.to(device=device, dtype=dtype) if dtype else model.to(device)
    model.eval()
    return model, config, read_meta(path)
