"""Many LoRA adapters over one frozen base in one batch, never merged into it (the idea of
Punica, Chen et al. 2023, "Punica: Multi-Tenant LoRA Serving", and S-LoRA, Sheng et al.
2023): each token carries the slot of its adapter, and every adapted linear adds

    y = base(x) + s_a · (x A_aᵀ) B_aᵀ        a = the token's adapter; no update without one

computed for all the step's tokens at once. A `LoraBank` holds `n_slots` adapters side by
side: per adapted layer, A of every slot stacked along the rank, `A [n_slots·r_max, in]`,
and B transposed the same way, `Bt [n_slots·r_max, out]` (fp32, ranks below r_max padded
with zeros). A step selects the slots of its tokens (`with bank.select(token_slots):`),
which builds one mask `M [N, W]` — `s_a` where column j belongs to token n's slot, else 0 —
over the columns of the slots in use (W = their span × r_max), and each layer computes

    y += ((x A[cols]ᵀ) ⊙ M) Bt[cols]           two GEMMs of width W, whatever the mix

The mask zeroes the other adapters' products exactly, so a token's update equals the one
its adapter alone gives (up to the summation order of the GEMMs). The layers reach this
through `astrai.model.lora.project`, so the model code does not change; outside a
`select` block (and for layers no selected slot adapts) nothing is added.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import nn

Tensor = torch.Tensor


class _Selection:
    """The slots of one step's tokens: the column span and the scaled mask."""

    __slots__ = ("bank", "hi", "lo", "mask", "used")

    def __init__(self, bank: LoraBank, token_slots: Sequence[int]) -> None:
        r = bank.r_max
        used = sorted({s for s in token_slots if s >= 0})
        self.bank, self.used = bank, frozenset(used)
        self.lo, self.hi = used[0] * r, (used[-1] + 1) * r
        dev = bank.device
        idx = torch.tensor(list(token_slots), dtype=torch.long).to(dev)  # (N,)
        col_slot = torch.arange(self.lo, self.hi, device=dev) // r  # (W,)
        scale = torch.tensor(bank.scales, dtype=torch.float32).to(dev)[col_slot]
        self.mask = (idx[:, None] == col_slot[None, :]).float() * scale  # (N, W)


_active: _Selection | None = None


class LoraBank:
    """`n_slots` adapters of rank at most `r_max` on the linear layers `layers` (module
    name -> layer) of one model. Slots are written and cleared between steps."""

    def __init__(self, layers: dict[str, nn.Module], n_slots: int, r_max: int,
                 device: torch.device) -> None:
        self.layers = layers
        self.n_slots, self.r_max, self.device = n_slots, r_max, device
        self.scales = [0.0] * n_slots
        self._a: dict[nn.Module, Tensor] = {}
        self._bt: dict[nn.Module, Tensor] = {}
        self._slots_of: dict[nn.Module, set[int]] = {}
        """The slots holding an update for the layer."""
        self._content: list[tuple[float, dict[str, tuple[Tensor, Tensor]]] | None] = (
            [None] * n_slots)

    def write(self, slot: int, scale: float, tensors: dict[str, tuple[Tensor, Tensor]]
              ) -> None:
        """Put an adapter in `slot`: `tensors` maps module names to (A [r, in], B [out, r]);
        a rank above r_max widens every layer's stack first."""
        rank = max((a.shape[0] for a, _ in tensors.values()), default=1)
        if rank > self.r_max:
            self._widen(rank)
        self.clear(slot)
        self._content[slot] = (scale, tensors)
        self.scales[slot] = float(scale)
        r0 = slot * self.r_max
        with torch.no_grad():
            for name, (a, b) in tensors.items():
                layer = self.layers[name]
                if layer not in self._a:
                    w = self.n_slots * self.r_max
                    self._a[layer] = torch.zeros(w, a.shape[1], device=self.device)
                    self._bt[layer] = torch.zeros(w, b.shape[0], device=self.device)
                    self._slots_of[layer] = set()
                r = a.shape[0]
                self._a[layer][r0:r0 + r] = a.to(self.device, torch.float32)
                self._bt[layer][r0:r0 + r] = b.t().to(self.device, torch.float32)
                self._slots_of[layer].add(slot)

    def clear(self, slot: int) -> None:
        """Empty `slot` (its columns zero in every layer)."""
        r0, r1 = slot * self.r_max, (slot + 1) * self.r_max
        for layer, slots in self._slots_of.items():
            if slot in slots:
                self._a[layer][r0:r1] = 0
                self._bt[layer][r0:r1] = 0
                slots.discard(slot)
        self._content[slot] = None
        self.scales[slot] = 0.0

    def _widen(self, rank: int) -> None:
        """Rebuild the stacks with r_max = rank, rewriting every slot."""
        content = self._content
        self.r_max = rank
        self._a, self._bt, self._slots_of = {}, {}, {}
        self._content = [None] * self.n_slots
        for slot, held in enumerate(content):
            if held is not None:
                self.write(slot, *held)

    @contextlib.contextmanager
    def select(self, token_slots: Sequence[int] | None) -> Iterator[None]:
        """Within the block, every adapted layer adds the update of each token's slot
        (`token_slots`: one per flattened token, -1 = none). None or all -1: no update."""
        global _active
        sel = None
        if token_slots is not None and any(s >= 0 for s in token_slots):
            sel = _Selection(self, token_slots)
        before, _active = _active, sel
        try:
            yield
        finally:
            _active = before

    def update(self, sel: _Selection, x: Tensor, layer: nn.Module, y: Tensor) -> Tensor:
        """y plus the selected slots' updates of `layer` (y itself when none adapts it)."""
        slots = self._slots_of.get(layer)
        if not slots or slots.isdisjoint(sel.used):
            return y
        a, bt = self._a[layer][sel.lo:sel.hi], self._bt[layer][sel.lo:sel.hi]
        x2 = x.reshape(-1, x.shape[-1])
        if x2.shape[0] != sel.mask.shape[0]:
            raise RuntimeError(f"LoRA selection of {sel.mask.shape[0]} tokens applied to "
                               f"{x2.shape[0]} rows")
        xa = (x2.to(torch.float32) @ a.t()).mul_(sel.mask)  # (N, W)
        if y.dtype == torch.float32 and y.is_contiguous():
            y.view(-1, y.shape[-1]).addmm_(xa, bt)
            return y
        return y + (xa @ bt).to(y.dtype).view(y.shape)


def apply(x: Tensor, layer: nn.Module, y: Tensor) -> Tensor:
    """y = layer's product of x, plus the active selection's LoRA updates (lora.project)."""
    sel = _active
    return y if sel is None else sel.bank.update(sel, x, layer, y)
