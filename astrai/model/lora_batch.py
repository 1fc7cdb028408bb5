"""Many LoRA adapters over one frozen base in one batch, never merged into it (the idea of
Punica, Chen et al. 2023, "Punica: Multi-Tenant LoRA Serving", and S-LoRA, Sheng et al.
2023): each token carries the slot of its adapter, and every adapted linear adds

    y = base(x) + s_a · (x A_aᵀ) B_aᵀ        a = the token's adapter; no update without one

A `LoraBank` holds, per slot and adapted layer, the adapter's own `A [r, in]` and
`B [out, r]` (fp32, each at its own rank: nothing is padded, and a slot emptied frees
its tensors, so the bank is the size of what is resident). A step selects the slots of
its tokens (`bank.selection(token_slots)`, which groups the token rows by slot once, rides
in the step's ForwardContext as `ctx.lora`); each layer then computes, per slot in use,

    y[rows_a] += s_a · (x[rows_a] A_aᵀ) B_aᵀ      rows_a = the tokens of adapter a

the grouped products Punica's SGMV kernel computes (segments of rows, one adapter each).
Rows are selected, never masked: a row is read and written only by its own adapter's
products, so another adapter's values — whatever they are, NaN included — cannot reach
it (0 × NaN is NaN: a 0/1 mask over a product of all the slots would spread them), and
base rows are left as the base computed them, bit for bit. The work is the rows times
their own adapter's rank, whatever else is resident. The layers reach this through
`astrai.model.lora.project`, so the model code does not change; without a selection in the
context (and for layers no selected slot adapts) nothing is added. A selection belongs to
one forward pass: nothing here is process state.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

Tensor = torch.Tensor
Rows = slice | Tensor
"""One slot's token rows: a slice when they are consecutive (a view, no copy), else an
index tensor."""


def _rows(token_slots: Sequence[int], slot: int, device: torch.device) -> Rows | None:
    """The rows of `slot` in `token_slots`: None for every row, a slice when consecutive."""
    rows = [i for i, s in enumerate(token_slots) if s == slot]
    if len(rows) == len(token_slots):
        return None
    if rows[-1] - rows[0] + 1 == len(rows):
        return slice(rows[0], rows[-1] + 1)
    return torch.tensor(rows, dtype=torch.long).to(device)


class LoraSelection:
    """The slots of one step's tokens: each used slot with its rows."""

    __slots__ = ("bank", "groups", "n", "used")

    def __init__(self, bank: LoraBank, token_slots: Sequence[int]) -> None:
        used = sorted({s for s in token_slots if s >= 0})
        self.bank, self.used, self.n = bank, frozenset(used), len(token_slots)
        self.groups = [(s, _rows(token_slots, s, bank.device)) for s in used]


class LoraBank:
    """The adapters of a model's linear layers `layers` (module name -> layer) by slot,
    on `device`. Slots are written and cleared between steps."""

    def __init__(self, layers: dict[str, nn.Module], device: torch.device) -> None:
        self.layers = layers
        self.device = device
        self._held: dict[nn.Module, dict[int, tuple[Tensor, Tensor, float]]] = {}
        """Per layer: slot -> (A [r, in], B [out, r], scale)."""

    def write(self, slot: int, scale: float, tensors: dict[str, tuple[Tensor, Tensor]]
              ) -> None:
        """Put an adapter in `slot`: `tensors` maps module names to (A [r, in], B [out, r]).
        On failure the slot is left empty, never half written."""
        self.clear(slot)
        try:
            for name, (a, b) in tensors.items():
                held = self._held.setdefault(self.layers[name], {})
                held[slot] = (a.to(self.device, torch.float32).contiguous(),
                              b.to(self.device, torch.float32).contiguous(), float(scale))
        except BaseException:
            self.clear(slot)
            raise

    def clear(self, slot: int) -> None:
        """Empty `slot`: its tensors are dropped from every layer."""
        for held in self._held.values():
            held.pop(slot, None)

    def nbytes(self) -> int:
        """Bytes of the resident adapters' tensors."""
        return sum(a.nbytes + b.nbytes for held in self._held.values()
                   for a, b, _ in held.values())

    def selection(self, token_slots: Sequence[int] | None) -> LoraSelection | None:
        """What a forward pass carries (`ForwardContext.lora`) so that every adapted layer
        adds the update of each token's slot (`token_slots`: one per flattened token,
        -1 = none). None or all -1: None, no update."""
        if token_slots is None or not any(s >= 0 for s in token_slots):
            return None
        return LoraSelection(self, token_slots)

    def update(self, sel: LoraSelection, x: Tensor, layer: nn.Module, y: Tensor) -> Tensor:
        """y plus the selected slots' updates of `layer`, each on its own rows only (y
        itself when none adapts it)."""
        held = self._held.get(layer)
        if not held or sel.used.isdisjoint(held):
            return y
        x2 = x.reshape(-1, x.shape[-1])  # (N, in)
        if x2.shape[0] != sel.n:
            raise RuntimeError(f"LoRA selection of {sel.n} tokens applied to "
                               f"{x2.shape[0]} rows")
        y = y if y.is_contiguous() else y.contiguous()
        y2 = y.view(-1, y.shape[-1])  # (N, out)
        for slot, rows in sel.groups:
            if slot in held:
                _add_update(x2, y2, rows, *held[slot])
        return y


def _add_update(x: Tensor, y: Tensor, rows: Rows | None, a: Tensor, b: Tensor,
                scale: float) -> None:
    """y[rows] += scale · (x[rows] Aᵀ) Bᵀ in place, in fp32, added in y's dtype."""
    if isinstance(rows, Tensor):
        xs = x.index_select(0, rows)
    else:
        xs = x if rows is None else x[rows]
    xa = xs.to(torch.float32) @ a.t()  # (N_a, r)
    ys = y if rows is None else None if isinstance(rows, Tensor) else y[rows]
    if ys is not None and y.dtype == torch.float32:
        ys.addmm_(xa, b.t(), alpha=scale)  # inside the GEMM: no [N_a, out] temporary
        return
    upd = torch.mm(xa, b.t()).mul_(scale).to(y.dtype)  # (N_a, out)
    if ys is not None:
        ys.add_(upd)
    else:
        y.index_add_(0, rows, upd)


def apply(sel: LoraSelection, x: Tensor, layer: nn.Module, y: Tensor) -> Tensor:
    """y = layer's product of x, plus the LoRA updates `sel` selects (lora.project)."""
    return sel.bank.update(sel, x, layer, y)
