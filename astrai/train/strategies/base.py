"""The strategy contract: `strategy(batch) -> {"loss": Tensor, "metrics": {str: Tensor | float}}`.

The trainer knows no loss; strategies know no loop (docs/train.md "Strategies"). What a
strategy must say besides its loss:

* `loss_units(batch)`: how many units (loss tokens, pairs, groups) the batch's loss is a
  mean over, as a tensor (counted, not read: the trainer reads the host only on logged
  steps, docs/train.md "Host reads") or an int where the count is host-side anyway. The
  trainer sums it over the accumulation window and passes the result back as
  `normalizer` (a float64 tensor), so the window's gradient equals the one of a single
  big batch.
* metrics: 0-dim tensors (seq, sft) or python floats (strategies whose figures come from
  host-side rollouts); the trainer accepts both and reads them only on logged steps.
* `dataset_kinds`: the dataset kinds it trains on (a mismatch is a user error).
* `evaluate_batch` / `eval_summary`: validation sums and their reduction.
* `on_optimizer_step`, `state_dict`, `load_state_dict`: hooks for stateful objectives
  (GRPO's old policy, rollout buffers) so resume is exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict

import torch
from torch import nn

from astrai.model.context import ForwardContext
from astrai.train.losses import IGNORE_INDEX, token_nll
from astrai.train.registry import reject_unknown

if TYPE_CHECKING:
    from astrai.config.train import TrainConfig
    from astrai.train.data import TrainData


@dataclass(frozen=True)
class StrategyInputs:
    """What a strategy may draw from the run when it is built (`Strategy.setup_kwargs`)."""

    config: TrainConfig
    """The run's resolved config (beta, clip_eps, ref_model, rollout options, ...)."""
    data: TrainData
    """The training data: samples, tokenizer directory and fingerprint, collate."""
    device: torch.device
    """The device the run trains on."""


class LossOutput(TypedDict):
    loss: torch.Tensor
    """Differentiable scalar, already divided by the window normalizer."""
    metrics: dict[str, torch.Tensor | float]
    """Detached 0-dim tensors or python floats for logging (unnormalised per-micro-batch
    means)."""


def _at_least_one(units: torch.Tensor | int) -> torch.Tensor | int:
    return units.clamp(min=1) if torch.is_tensor(units) else max(1, units)


class Strategy:
    name: ClassVar[str] = "base"
    dataset_kinds: ClassVar[tuple[str, ...]] = ()
    """Dataset kinds (manifest `kind`) this strategy trains on."""
    required_keys: ClassVar[tuple[str, ...]] = ("input_ids", "target_ids")

    def __init__(self, model: nn.Module, *, device: torch.device | str = "cpu",
                 label_smoothing: float = 0.0, moe_aux_loss_coef: float = 0.0,
                 **options: Any) -> None:
        reject_unknown("strategy", self.name, options)
        self.model, self.device = model, torch.device(device)
        self.label_smoothing, self.moe_aux_loss_coef = label_smoothing, moe_aux_loss_coef

    # -- construction hooks (used by astrai.train.builder) ---------------------------------
    @classmethod
    def prepare_model(cls, model: nn.Module, config: TrainConfig | None) -> nn.Module:
        """The module to train, given the one --model describes, before the executor wraps
        it and the optimizer sees its parameters (the reward strategy adds a scalar head)."""
        return model

    @classmethod
    def setup_kwargs(cls, inputs: StrategyInputs) -> dict[str, Any]:
        """Keyword arguments for __init__ drawn from the run: reference model, tokenizer,
        rollout options. strategy_kwargs override them."""
        return {}

    # -- batches ------------------------------------------------------------------------
    def to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device, non_blocking=True) if torch.is_tensor(v) else v
                for k, v in batch.items()}

    def targets(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """[B, T] targets with IGNORE_INDEX where no loss is taken."""
        return batch["target_ids"]

    def forward_context(self, batch: dict[str, torch.Tensor]) -> ForwardContext | None:
        return None

    def loss_units(self, batch: dict[str, torch.Tensor]) -> torch.Tensor | int:
        return (self.targets(batch) != IGNORE_INDEX).sum()

    def batch_samples(self, batch: dict[str, torch.Tensor]) -> int:
        """Samples (rows, pairs, prompts) in the batch, for consumed_samples."""
        return int(batch["input_ids"].shape[0])

    def batch_tokens(self, batch: dict[str, torch.Tensor]) -> int:
        """Tokens processed (for tokens/s and MFU), padding included."""
        return int(batch["input_ids"].numel())

    # -- the loss -------------------------------------------------------------------------
    def loss_sum(self, batch: dict[str, torch.Tensor]
                 ) -> tuple[torch.Tensor, torch.Tensor | int, torch.Tensor | None,
                            dict[str, torch.Tensor | float]]:
        """(summed task loss, units, unweighted MoE aux loss or None, extra metrics)."""
        raise NotImplementedError

    def __call__(self, batch: dict[str, torch.Tensor],
                 normalizer: torch.Tensor | float | None = None) -> LossOutput:
        loss_sum, units, aux, metrics = self.loss_sum(batch)
        norm = _at_least_one(units) if normalizer is None else normalizer
        norm = norm.double() if torch.is_tensor(norm) else norm
        # A tensor divisor in the loss's dtype (a count, exact): the same division a python
        # number gives, without reading the count on the host.
        loss = loss_sum / (norm.to(loss_sum.dtype) if torch.is_tensor(norm) else float(norm))
        task_mean = loss_sum.detach().float() / _at_least_one(units)
        metrics = {f"{self.name}_loss": task_mean, **metrics}
        if aux is not None:
            # The aux loss is a per-micro-batch mean; weighting it by this micro-batch's
            # share of the window's units makes the window value a unit-weighted mean.
            weighted = self.moe_aux_loss_coef * aux
            share = units / norm
            loss = loss + weighted * (share.to(weighted.dtype) if torch.is_tensor(share)
                                      else share)
            metrics["moe_aux_loss"] = aux.detach()
            metrics["moe_aux_loss_weighted"] = weighted.detach()
        return {"loss": loss, "metrics": metrics}

    # -- validation ------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate_batch(self, batch: dict[str, torch.Tensor],
                       byte_lengths: torch.Tensor | None) -> dict[str, float]:
        """Sums over one batch: nll (nats), loss tokens, and the UTF-8 bytes those tokens
        decode to (when a byte table is known)."""
        out = self.model(batch["input_ids"], self.forward_context(batch))
        targets = self.targets(batch)
        valid = targets != IGNORE_INDEX
        sums = {"nll": float(token_nll(out.logits, targets).sum()), "tokens": int(valid.sum())}
        if byte_lengths is not None:
            lengths = byte_lengths.to(targets.device)[targets.clamp(min=0)]  # (B, T)
            sums["bytes"] = int((lengths * valid).sum())
        return sums

    def eval_summary(self, sums: dict[str, float]) -> dict[str, float]:
        """val_loss (nats/token), val_ppl and val_bpb (bits per UTF-8 byte)."""
        tokens = max(1, int(sums.get("tokens", 0)))
        loss = sums["nll"] / tokens
        out = {"val_loss": loss, "val_ppl": math.exp(min(loss, 80.0))}
        if sums.get("bytes"):
            out["val_bpb"] = sums["nll"] / math.log(2) / sums["bytes"]
        return out

    # -- stateful objectives ------------------------------------------------------------------
    def on_optimizer_step(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
