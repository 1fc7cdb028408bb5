"""AdamW whose moments keep their own dtype, independent of the parameters' dtype.

torch.optim.AdamW stores exp_avg / exp_avg_sq in the parameter's dtype, so bf16 weights
get bf16 moments — the configuration the BF16 lock-in study (docs/bf16-lockin.md,
"Solution") advises against. This variant keeps the moments in `state_dtype` (fp32 by
default), computes the whole update in fp32, and rounds only the final weight write to the
parameter dtype (to nearest, stochastically, or Kahan-compensated: astrai.train.bf16_update).
With fp32 parameters and fp32 moments it is the same algorithm as torch.optim.AdamW
(Loshchilov & Hutter 2019, decoupled decay), op for op:

    p   <- p * (1 - lr * wd)
    m   <- lerp(m, g, 1 - b1)                   v <- b2 * v + (1 - b2) * g^2
    p   <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

Its state_dict has torch.optim.AdamW's layout (step, exp_avg, exp_avg_sq), so checkpoints
move between the two. FSDP2 DTensor parameters are updated through their local shards
(every op is elementwise), with DTensor moments so full state dicts gather correctly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from astrai.inspect.visibility import adam_denom, adam_step_size
from astrai.train.bf16_update import KAHAN_KEY, WeightWriter


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def init_adamw_state(state: dict[str, Any], p: torch.Tensor, state_dtype: torch.dtype
                     ) -> dict[str, Any]:
    """torch.optim.AdamW's state layout (step, exp_avg, exp_avg_sq), moments in state_dtype."""
    if not state:
        state["step"] = torch.tensor(0.0, dtype=torch.float32)
        state["exp_avg"] = torch.zeros_like(p, dtype=state_dtype,
                                            memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, dtype=state_dtype,
                                               memory_format=torch.preserve_format)
    return state


def adamw_update_(p: torch.Tensor, state: dict[str, Any], *, lr: float,
                  betas: tuple[float, float], eps: float, weight_decay: float,
                  writer: WeightWriter | None = None) -> None:
    """One AdamW step of `p` (the formula above) from p.grad, in fp32; the moments are
    written back rounded to their dtype, the parameter by `writer` (default: nearest)."""
    writer = writer or WeightWriter()
    b1, b2 = betas
    state["step"] += 1
    t = float(state["step"])
    m, v = _local(state["exp_avg"]), _local(state["exp_avg_sq"])
    g = _local(p.grad).float()
    # fp32 working copies (views when already fp32)
    p32, m32, v32 = writer.read(p, state), m.float(), v.float()
    p32.mul_(1 - lr * weight_decay)
    m32.lerp_(g, 1 - b1)
    v32.mul_(b2).addcmul_(g, g, value=1 - b2)
    # the formula inspect-weights predicts this write with (astrai.inspect.visibility)
    p32.addcdiv_(m32, adam_denom(v32, t, b2, eps), value=-adam_step_size(lr, b1, t))
    writer.write(p, p32, state)
    for dst, src in ((m, m32), (v, v32)):
        if dst.data_ptr() != src.data_ptr():
            dst.copy_(src)  # round to the stored dtype


def restore_state_dtype(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any],
                        state_dtype: torch.dtype) -> None:
    """After torch's load_state_dict, put back the saved moments in `state_dtype`.

    torch.optim.Optimizer.load_state_dict casts every floating state tensor to its
    parameter's dtype, so fp32 moments of bf16 weights would come back bf16 (rounded) on
    resume. The saved tensors are the exact values: cast them again, from the source.
    The Kahan compensation stays in the parameter's dtype (astrai.train.bf16_update)."""
    saved = [i for g in state_dict["param_groups"] for i in g["params"]]
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for key, p in zip(saved, params):
        for name, value in state_dict["state"].get(key, {}).items():
            if name not in ("step", KAHAN_KEY) and torch.is_tensor(value) and value.is_floating_point():
                optimizer.state[p][name] = value.to(device=p.device, dtype=state_dtype)


class AdamW(torch.optim.Optimizer):
    """`defaults` adds group options a subclass reads (astrai.train.muon.MuonAdamW)."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, *, state_dtype: torch.dtype = torch.float32,
                 bf16_update: str = "nearest", rounding_seed: int = 0,
                 **defaults: Any) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps,
                                  "weight_decay": weight_decay, **defaults})
        self.state_dtype = state_dtype
        self.writer = WeightWriter(bf16_update, rounding_seed)
        """How bf16 weights take their fp32 update (--bf16-update); holds the
        stochastic-rounding generators, checkpointed beside the optimizer state."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        restore_state_dtype(self, state_dict, self.state_dtype)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group)
        return loss

    def _update(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        state = init_adamw_state(self.state[p], p, self.state_dtype)
        adamw_update_(p, state, lr=float(group["lr"]), betas=group["betas"], eps=group["eps"],
                      weight_decay=group["weight_decay"], writer=self.writer)
