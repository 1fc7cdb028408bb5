"""The frozen reference policy of dpo / grpo / online-*: where it comes from.

Default: the initial policy, i.e. `--model` resolved again exactly as the run resolved it
(a preset is rebuilt with the run's seed, a checkpoint is loaded again), so a resumed run
gets the same reference without storing it. `--ref-model DIR` names another checkpoint.
A LoRA run's reference is its own base: the policy with adapters disabled (PolicyBase,
TRL's choice with PEFT), so no second copy of the model exists.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from astrai.errors import AstraiError, ConfigError
from astrai.train.strategies.base import StrategyInputs


def reference_factory(inputs: StrategyInputs) -> Callable[[], nn.Module]:
    """A callable building the reference for a run; loads lazily."""
    from astrai.train.model_source import resolve_model

    config, data = inputs.config, inputs.data
    if config.lora.enabled and not config.alignment.ref_model:
        return PolicyBase
    spec = config.alignment.ref_model or config.model
    overrides = {} if config.alignment.ref_model else config.model_overrides
    what = "ref_model" if config.alignment.ref_model else "reference (the initial --model)"

    def build() -> nn.Module:
        try:
            source = resolve_model(spec, vocab_size=data.vocab_size, seq_len=data.seq_len,
                                   seed=config.seed, overrides=overrides,
                                   tokenizer_fingerprint=data.fingerprint)
        except AstraiError as e:
            raise ConfigError(f"{what}: {e}") from None
        return source.model_fn()

    return build


class PolicyBase:
    """The reference of a LoRA run: the policy itself with its adapters disabled (the
    frozen base it started from), so no second copy of the model exists. `freeze` binds
    it to the policy."""

    def __init__(self) -> None:
        self.policy: nn.Module | None = None

    def __call__(self, *args, **kwargs):
        from astrai.model.lora import adapters_disabled
        from astrai.train.executors import unwrap

        model = unwrap(self.policy)
        with torch.no_grad(), adapters_disabled(model):
            return model(*args, **kwargs)


def freeze(model: nn.Module | PolicyBase, like: nn.Module) -> nn.Module | PolicyBase:
    """`model` in eval mode without gradients, on the device and dtype of `like`'s weights
    (a PolicyBase is bound to the policy `like` instead)."""
    if isinstance(model, PolicyBase):
        model.policy = like
        return model
    p = next(like.parameters())
    model = model.to(device=p.device, dtype=p.dtype)
    model.eval().requires_grad_(False)
    return model


@torch.no_grad()
def copy_weights(dst: nn.Module, src: nn.Module) -> None:
    """dst <- src in place (an old-policy sync); both plain modules of the same shape."""
    for (name, a), b in zip(dst.state_dict().items(), src.state_dict().values()):
        if a.shape != b.shape:
            raise RuntimeError(f"copy_weights: {name} {tuple(a.shape)} vs {tuple(b.shape)}")
        a.copy_(b)
