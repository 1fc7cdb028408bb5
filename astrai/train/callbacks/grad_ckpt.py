"""Activation (gradient) checkpointing of chosen module types (seeds/training.md).

Each matching module's forward is wrapped in torch.utils.checkpoint(use_reentrant=False):
its activations are recomputed in backward instead of stored. `nn.Module.modules()` finds
them through any wrapper (DDP's .module); the originals come back at on_train_end.
"""

from __future__ import annotations

import functools

from torch import nn
from torch.utils.checkpoint import checkpoint

from astrai.model.block import DecoderBlock
from astrai.train.callbacks.base import Callback


def _checkpointed(forward, *args, **kwargs):
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


class GradientCheckpointingCallback(Callback):
    name = "gradient_checkpointing"

    def __init__(self, module_types: tuple[type[nn.Module], ...] = (DecoderBlock,)) -> None:
        self.module_types = tuple(module_types)
        self.wrapped: list[nn.Module] = []

    def on_train_begin(self, ctx) -> None:
        for module in ctx.model.modules():
            if isinstance(module, self.module_types) and module not in self.wrapped:
                module.forward = functools.partial(_checkpointed, module.forward)
                self.wrapped.append(module)

    def on_train_end(self, ctx) -> None:
        for module in self.wrapped:
            del module.forward  # the instance attribute; the class method shows again
        self.wrapped.clear()
