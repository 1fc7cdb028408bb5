"""How an optimizer writes its fp32 result into a bf16 weight (`--bf16-update`).

With `--precision bf16-true` the optimizers compute each update in fp32
(astrai.train.adamw, astrai.train.muon); this module is the last step, the write:

    nearest     round to nearest even. An update smaller than half a bf16 ulp rounds away:
                the lock-in of docs/bf16-lockin.md ("Stage 3").
    stochastic  stochastic rounding: add 16 uniform random bits below the bf16 mantissa of
                the fp32 result, then truncate. A value between two bf16 neighbours lands on
                the upper one with probability equal to its distance from the lower one, so
                E[round(x)] = x and tiny updates move the weight on average ("Revisiting
                BFloat16 Training", Zamirai et al. 2020; Gupta et al. 2015, "Deep Learning
                with Limited Numerical Precision"). The bits come from a seeded
                torch.Generator per device whose state goes into the checkpoint.
    kahan       Kahan-compensated summation: a bf16 buffer `kahan_comp` in the optimizer
                state holds what the last write rounded away; the optimizer works on the
                fp32 value w + c, and the new rounding error becomes c (Kahan 1965; Zamirai
                et al. 2020, "Kahan summation"). 2 more bytes per parameter.

fp32 parameters (fp32 runs, LoRA adapters, which stay fp32 over a bf16 base) are written as
they are in every mode: there is no rounding to manage.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch.distributed.tensor import DTensor

BF16Update = Literal["nearest", "stochastic", "kahan"]
BF16_UPDATES: tuple[str, ...] = ("nearest", "stochastic", "kahan")
KAHAN_KEY = "kahan_comp"
LOW_BITS = 1 << 16
"""fp32 has 23 stored mantissa bits, bf16 7: the 16 low bits are what rounding removes."""


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def stochastic_round(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """fp32 `x` -> bf16, rounded up in magnitude with probability (x - lower) / ulp.

    IEEE floats are sign-magnitude, so adding u ~ U{0 .. 2^16 - 1} to the integer bits and
    clearing the low 16 moves |x| to the next bf16 value exactly when the low bits + u carry,
    i.e. with probability low / 2^16, for either sign. inf passes through (its mantissa is
    zero: nothing carries), and so does torch's NaN (its quiet bit 22 lies above the cleared
    bits); a value past bf16's largest rounds up to inf with its probability, as it should.
    Four elementwise passes (draw, add, mask, convert), in place on the noise: no finite
    check and select, which took half the time (4.0 against 7.9 ms per 2^20 entries on one
    CPU thread, bit-identical results)."""
    x = x.float().contiguous()
    bits = torch.randint(0, LOW_BITS, x.shape, dtype=torch.int32, device=x.device,
                         generator=generator)
    bits.add_(x.view(torch.int32)).bitwise_and_(-LOW_BITS)  # -2^16 = ~0xFFFF: clear low bits
    return bits.view(torch.float32).bfloat16()  # exact: the low bits are zero


class WeightWriter:
    """Reads a parameter into fp32 for the optimizer and writes the fp32 result back in
    the chosen mode. Owns the stochastic-rounding generators (one per device, created at
    the first write from `seed`) and their checkpointed state."""

    def __init__(self, mode: str = "nearest", seed: int = 0) -> None:
        if mode not in BF16_UPDATES:
            raise ValueError(f"bf16_update: unknown '{mode}'; choose {', '.join(BF16_UPDATES)}")
        self.mode, self.seed = mode, seed
        self.generators: dict[str, torch.Generator] = {}
        self._pending: dict[str, torch.Tensor] = {}

    def rounds(self, p: torch.Tensor) -> bool:
        """The mode acts on `p`: a bf16 parameter and a mode other than nearest."""
        return self.mode != "nearest" and p.dtype == torch.bfloat16

    def read(self, p: torch.Tensor, state: dict[str, Any]) -> torch.Tensor:
        """The fp32 working copy of `p`'s local values: a view when already fp32; with
        kahan, w + c (c created as zeros like `p`, a DTensor for FSDP2 parameters)."""
        if self.mode == "kahan" and self.rounds(p):
            if KAHAN_KEY not in state:
                state[KAHAN_KEY] = torch.zeros_like(p, memory_format=torch.preserve_format)
            return _local(p).float().add_(_local(state[KAHAN_KEY]).float())
        return _local(p).float()

    def write(self, p: torch.Tensor, p32: torch.Tensor, state: dict[str, Any]) -> None:
        """Store the fp32 result `p32` (from `read`) into `p` in the chosen mode."""
        param = _local(p)
        if param.data_ptr() == p32.data_ptr():
            return  # an fp32 parameter, updated in place
        if not self.rounds(param):
            param.copy_(p32)  # round to nearest even
        elif self.mode == "stochastic":
            param.copy_(stochastic_round(p32, self.generator(param.device)))
        else:
            param.copy_(p32)
            _local(state[KAHAN_KEY]).copy_(p32.sub_(param.float()))  # what was rounded away

    def generator(self, device: torch.device) -> torch.Generator:
        key = str(device)
        if key not in self.generators:
            g = torch.Generator(device=device)
            g.manual_seed(self.seed)
            if key in self._pending:
                g.set_state(self._pending.pop(key))
            self.generators[key] = g
        return self.generators[key]

    def state_dict(self) -> dict[str, Any]:
        """{"mode", "seed", "generators": {device: ByteTensor state}} (a resume restores it)."""
        states = {k: g.get_state() for k, g in self.generators.items()}
        return {"mode": self.mode, "seed": self.seed, "generators": {**self._pending, **states}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore saved generator states (applied when each device's generator is made)."""
        self.generators.clear()
        self._pending = {k: v.cpu() for k, v in state.get("generators", {}).items()}


def rounding_seed(seed: int, rank: int, parallel: str) -> int:
    """The stochastic-rounding seed of a rank. DDP replicas hold the same full weights and
    take the same update, so they draw the same bits (and stay identical); FSDP2 ranks hold
    different shards, so each draws its own stream."""
    return seed + 1_000_003 * rank if parallel == "fsdp" else seed


def rounding_states(optimizer: Any) -> list[dict[str, Any]] | None:
    """Every rank's WeightWriter state, in rank order (a collective when distributed: all
    ranks call it), for the checkpoint; None when the optimizer draws no random bits."""
    writer = getattr(optimizer, "writer", None)
    if writer is None or writer.mode != "stochastic":
        return None
    state = writer.state_dict()
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [state]
    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, state)
    return out


def restore_rounding(optimizer: Any, states: list[dict[str, Any]] | None, rank: int) -> None:
    """Put back this rank's generator state saved by `rounding_states` (DDP's are all equal;
    a resume on more ranks than were saved starts the new ranks' streams from their seed)."""
    writer = getattr(optimizer, "writer", None)
    if writer is not None and states and rank < len(states):
        writer.load_state_dict(states[rank])
