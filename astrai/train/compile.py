"""Model transforms that trade compile time or recomputation for speed and memory.

* `apply_compile(model, "block" | "model")`: torch.compile of each decoder block (one
  graph per block, compiled once and reused by all blocks of the same shape; cheap to
  compile, and what FSDP2 wants: its all-gather/reduce-scatter hooks stay outside the
  compiled graphs) or of the whole model. Compiled in place with `nn.Module.compile`, so
  parameter names, state dicts and checkpoints do not change. Applied before the DDP /
  FSDP wrapper (torchtitan's order: compile, then shard).
* `checkpoint_module_types(names)`: the module classes whose activations are recomputed
  in backward (`--gradient-checkpointing`, torch.utils.checkpoint with
  use_reentrant=False), and `apply_activation_checkpointing(model, types)` which wraps
  their forwards; applied by the builder after the executor wrapped the model.
"""

from __future__ import annotations

import functools

from torch import nn
from torch.utils.checkpoint import checkpoint

from astrai.errors import ConfigError
from astrai.model.attention import Attention
from astrai.model.block import DecoderBlock
from astrai.model.mlp import SwiGLU
from astrai.model.moe import MoE

COMPILE_MODES = ("none", "block", "model")
CHECKPOINTABLE: dict[str, type[nn.Module]] = {
    "DecoderBlock": DecoderBlock, "Attention": Attention, "SwiGLU": SwiGLU, "MoE": MoE,
}


def apply_compile(model: nn.Module, mode: str = "none", *, backend: str = "inductor",
                  fullgraph: bool = False) -> nn.Module:
    """Compile `model` in place ("none" returns it untouched)."""
    if mode not in COMPILE_MODES:
        raise ConfigError(f"compile: unknown '{mode}'; choose one of {', '.join(COMPILE_MODES)}")
    kw = {"backend": backend, "fullgraph": fullgraph}
    if mode == "model":
        model.compile(**kw)
    elif mode == "block":
        for module in model.modules():
            if isinstance(module, DecoderBlock):
                module.compile(**kw)
    return model


def checkpoint_module_types(names: list[str]) -> tuple[type[nn.Module], ...]:
    """Classes for `gradient_checkpointing_modules` names (DecoderBlock, Attention, ...)."""
    unknown = [n for n in names if n not in CHECKPOINTABLE]
    if unknown:
        raise ConfigError(
            f"gradient_checkpointing_modules: unknown '{unknown[0]}'; choose from "
            f"{', '.join(CHECKPOINTABLE)}"
        )
    return tuple(CHECKPOINTABLE[n] for n in names)


def _checkpointed(forward, *args, **kwargs):
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def apply_activation_checkpointing(model: nn.Module, module_types: tuple[type[nn.Module], ...]
                                   ) -> list[nn.Module]:
    """Wrap the forward of every module of `module_types` (found through any wrapper, e.g.
    DDP's .module) in torch.utils.checkpoint(use_reentrant=False): its activations are
    recomputed in backward instead of stored. Returns the wrapped modules."""
    wrapped = []
    for module in model.modules():
        if isinstance(module, module_types) and "forward" not in vars(module):
            module.forward = functools.partial(_checkpointed, module.forward)
            wrapped.append(module)
    return wrapped
