"""Numeric precision of a run: parameter dtype, the autocast region, optimizer-moment dtype.

    fp32         fp32 weights, activations and moments; no autocast.
    bf16-mixed   fp32 master weights and moments; forward under bf16 autocast (matmuls in
                 bf16, reductions and the loss in fp32).
    bf16-true    bf16 weights, activations and gradients; no autocast.

Optimizer moments are fp32 unless `--optimizer-state-dtype bf16`. The BF16 lock-in case
study (docs/bf16-lockin.md, "Stage 3: BF16 dead zone" and "Solution") traces part
of the failure to bf16 AdamW moments that "lose precision at large magnitudes" and
recommends fp32 moments: so with bf16-true weights the moments stay fp32 and the update is
computed in fp32 (astrai.train.adamw), and only the final weight write rounds to bf16 —
to nearest, stochastically or Kahan-compensated (`--bf16-update`, astrai.train.bf16_update).

`--precision auto` is bf16-mixed on CUDA (when the GPU has bf16) and fp32 elsewhere
(docs/distributed.md "Precision"): bf16 matmuls on CPUs without bf16 units are ~100x
slower than fp32.
"""

from __future__ import annotations

import contextlib

import torch

from astrai.errors import ConfigError
from astrai.train.bf16_update import BF16_UPDATES

STATE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class Precision:
    """fp32: parameters, activations and optimizer moments in float32; no autocast."""

    name = "fp32"
    param_dtype = torch.float32

    def __init__(self, state_dtype: torch.dtype = torch.float32,
                 bf16_update: str = "nearest") -> None:
        self.state_dtype = state_dtype
        """dtype of the AdamW moments (exp_avg, exp_avg_sq)."""
        self.bf16_update = bf16_update
        """How the optimizer writes a bf16 weight (astrai.train.bf16_update); bf16-true only."""

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def describe(self) -> str:
        state = {torch.float32: "fp32", torch.bfloat16: "bf16"}[self.state_dtype]
        update = f", {self.bf16_update} bf16 update" if self.bf16_update != "nearest" else ""
        return (f"{self.name} (weights {str(self.param_dtype)[6:]}, optimizer moments "
                f"{state}{update})")


class BF16Mixed(Precision):
    """fp32 master weights and moments; matmuls under bf16 autocast."""

    name = "bf16-mixed"

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


class BF16True(Precision):
    """bf16 weights and gradients; moments fp32 unless asked otherwise (paper's advice)."""

    name = "bf16-true"
    param_dtype = torch.bfloat16


PRECISIONS: dict[str, type[Precision]] = {
    "fp32": Precision, "bf16-mixed": BF16Mixed, "bf16-true": BF16True,
}


def auto_precision(device: torch.device) -> str:
    """bf16-mixed on a CUDA device with bf16 support, fp32 elsewhere."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return "bf16-mixed"
    return "fp32"


def resolve_precision(precision: str, device: torch.device,
                      optimizer_state_dtype: str = "fp32", bf16_update: str = "nearest"
                      ) -> Precision:
    """`auto` = bf16-mixed on CUDA, fp32 elsewhere; moments in `optimizer_state_dtype`;
    `bf16_update` other than nearest only with bf16-true (the others keep fp32 weights,
    which have no bf16 rounding to manage); auto = stochastic with bf16-true, else nearest."""
    name = auto_precision(device) if precision == "auto" else precision
    if name not in PRECISIONS:
        raise ConfigError(
            f"precision: unknown '{precision}'; choose auto or one of {', '.join(PRECISIONS)}"
        )
    if optimizer_state_dtype not in STATE_DTYPES:
        raise ConfigError(
            f"optimizer_state_dtype: unknown '{optimizer_state_dtype}'; choose fp32 or bf16"
        )
    if bf16_update == "auto":  # the measured default (docs/bf16-lockin.md)
        bf16_update = "stochastic" if name == "bf16-true" else "nearest"
    if bf16_update not in BF16_UPDATES:
        raise ConfigError(f"bf16_update: unknown '{bf16_update}'; choose "
                          f"{', '.join(BF16_UPDATES)}")
    if bf16_update != "nearest" and name != "bf16-true":
        given = f"{precision} = {name}" if precision == "auto" else name
        raise ConfigError(f"bf16_update: '{bf16_update}' needs --precision bf16-true (this run "
                          f"is {given}, whose fp32 weights take updates exactly); drop "
                          "--bf16-update or add --precision bf16-true")
    return PRECISIONS[name](STATE_DTYPES[optimizer_state_dtype], bf16_update)
