"""Gradient clipping: always registered (seeds/training.md), so grad_norm is always known."""

from __future__ import annotations

from astrai.train.callbacks.base import Callback


class GradientClippingCallback(Callback):
    """Measures the global gradient L2 norm of this step and clips it to max_grad_norm
    (0 = measure only). The norm logged for step N is the pre-clip norm of step N."""

    name = "gradient_clipping"

    def __init__(self, max_grad_norm: float) -> None:
        self.max_grad_norm = float(max_grad_norm)

    def on_optimizer_step(self, ctx) -> None:
        ctx.grad_norm = float(ctx.executor.clip_grad_norm(self.max_grad_norm))
