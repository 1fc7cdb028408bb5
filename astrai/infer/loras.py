"""The LoRA adapters an engine serves beside its base, and which of them sit in the
batch's slots (astrai.model.lora_batch).

    loras = LoraSet(model, max_loras=4, max_rank=16, max_loaded=32)
    loras.add("sql", "adapters/sql")          # a PEFT LoRA directory (astrai's own too)
    loras.names                               # ("sql",): read without any lock
    req.lora = loras.get("sql")               # the request asks for it
    loras.can_admit(req.lora); loras.acquire(req) ... loras.release(req)   # the scheduler
    runner.run(batch, backend, loras.selection(loras.token_slots(batch)))   # the forward

Registered adapters wait on the host; `max_loras` of them at a time sit in the bank's
slots (vLLM's `--max-loras`). A request is admitted only when its adapter has a slot or
one is free (no running request uses it; the least recently used such slot is rewritten),
so requests for other adapters wait until a slot frees — running requests always finish,
so a slot always frees. An adapter is found by the prefix cache only under its own key
(`Adapter.key`, never reused), so no prefix computed under one adapter serves another or
the base.

What may register is bounded, as vLLM bounds it: an adapter's rank (`max_rank`, vLLM's
`--max-lora-rank`), how many are registered at once (`max_loaded`), and its name (a
bounded run of letters, digits and `._:/@+-`, so it is safe in a JSON field, a log line
or a metric label).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from astrai.errors import CheckpointError, ConfigError
from astrai.model.adapter import (
    ADAPTER_CONFIG,
    check_fit,
    read_adapter_spec,
    read_adapter_weights,
)
from astrai.model.lora import BLOCK_PART, TARGETS, LoraSpec
from astrai.model.lora_batch import LoraBank, LoraSelection

_uids = itertools.count(1)
MAX_LORA_RANK = 16
"""Default largest adapter rank served (vLLM's --max-lora-rank default)."""
MAX_LOADED_LORAS = 32
"""Default most adapters registered at once."""
MAX_NAME_CHARS = 128
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]*")
"""An adapter name: ASCII letters and digits, then also `._:/@+-` (`org/sql-v2`)."""


def check_name(name: object) -> str:
    """`name` when it can name an adapter, else a ConfigError saying what a name is."""
    if (not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS
            or NAME.fullmatch(name) is None):
        shown = repr(name) if not isinstance(name, str) or len(name) <= 40 else \
            f"of {len(name)} characters"
        raise ConfigError(f"lora name {shown}: give 1-{MAX_NAME_CHARS} characters, ASCII "
                          "letters and digits, then also . _ : / @ + - (no spaces or control "
                          "characters)")
    return name


@dataclass(eq=False)
class Adapter:
    """One registered adapter: its weights on the host, per adapted module (A, B)."""

    name: str
    path: str
    spec: LoraSpec
    tensors: dict[str, tuple[torch.Tensor, torch.Tensor]]
    key: str
    """The prefix cache's key for it: unique per registration, never reused."""

    @property
    def rank(self) -> int:
        return self.spec.rank


def adaptable_layers(model: nn.Module) -> dict[str, nn.Module]:
    """The block linears an adapter may target (astrai names), plain or int8."""
    out: dict[str, nn.Module] = {}
    for parent_name, parent in model.named_modules():
        if BLOCK_PART.search(parent_name):
            for leaf, child in parent.named_children():
                if leaf in TARGETS and hasattr(child, "in_features"):
                    out[f"{parent_name}.{leaf}"] = child
    return out


def read_adapter(name: str, path: str | Path, layers: dict[str, nn.Module],
                 max_rank: int | None = None) -> Adapter:
    """A PEFT LoRA directory read and checked against the model's layers; every missing,
    unexpected or mis-shaped tensor is named in one CheckpointError, and so is a rank above
    `max_rank` (before its weights are read)."""
    spec = read_adapter_spec(path)
    if max_rank is not None and spec.rank > max_rank:
        raise CheckpointError(f"{Path(path) / ADAPTER_CONFIG}: r {spec.rank} is above the "
                              f"largest rank served, {max_rank}; raise max_lora_rank "
                              "(--max-lora-rank) to serve it")
    state = read_adapter_weights(path)
    want = {f"{m}.lora_{ab}.weight" for m in layers if m.rsplit(".", 1)[-1] in spec.targets
            for ab in "AB"}
    missing, extra = sorted(want - set(state)), sorted(set(state) - want)
    shapes = []
    for k in sorted(set(state) & want):
        layer, t = layers[k.rpartition(".lora_")[0]], state[k]
        rows, cols = ((spec.rank, layer.in_features) if ".lora_A." in k
                      else (layer.out_features, spec.rank))
        if tuple(t.shape) != (rows, cols):
            shapes.append(k)
    check_fit(path, missing, extra, shapes)
    tensors = {}
    for k in sorted(state):
        if ".lora_A." in k:
            m = k.rpartition(".lora_")[0]
            tensors[m] = (state[k].float(), state[f"{m}.lora_B.weight"].float())
    return Adapter(name, str(path), spec, tensors, f"lora{next(_uids)}")


class LoraSet:
    """Registered adapters by name, and the bank slots they occupy."""

    def __init__(self, model: nn.Module, max_loras: int = 1, *,
                 max_rank: int = MAX_LORA_RANK, max_loaded: int = MAX_LOADED_LORAS) -> None:
        for field, value in (("max_loras", max_loras), ("max_lora_rank", max_rank),
                             ("max_loaded_loras", max_loaded)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{field} {value!r}: must be an integer >= 1")
        self.layers = adaptable_layers(model)
        self.max_loras, self.max_rank, self.max_loaded = max_loras, max_rank, max_loaded
        self.adapters: dict[str, Adapter] = {}
        self.names: tuple[str, ...] = ()
        """The registered names, replaced whole on every change: readers (the server's
        event loop) take it without the engine's lock."""
        self._bank = LoraBank(self.layers, next(model.parameters()).device)
        self._slots: list[Adapter | None] = [None] * max_loras
        self._refs = [0] * max_loras
        self._used = [0] * max_loras
        self._clock = itertools.count(1)

    # -- registry --------------------------------------------------------------------------
    def read(self, name: str, path: str | Path) -> Adapter:
        """The adapter at `path`, checked against the model (the slow part, file reads:
        no lock needed)."""
        check_name(name)
        self._check_free(name)
        if not self.layers:
            raise ConfigError("lora: this model has no linear layers an adapter can target "
                              "(mixture-of-experts FFNs take no LoRA)")
        return read_adapter(name, path, self.layers, self.max_rank)

    def register(self, adapter: Adapter) -> Adapter:
        self._check_free(adapter.name)
        self.adapters[adapter.name] = adapter
        self.names = tuple(self.adapters)
        return adapter

    def add(self, name: str, path: str | Path) -> Adapter:
        return self.register(self.read(name, path))

    def _check_free(self, name: str) -> None:
        if name in self.adapters:
            raise ConfigError(f"lora '{name}' is already loaded; unload it first")
        if len(self.adapters) >= self.max_loaded:
            raise ConfigError(f"lora '{name}': {len(self.adapters)} adapters are loaded, the "
                              "most max_loaded_loras (--max-loaded-loras) allows; unload one "
                              "first")

    def remove(self, name: str) -> None:
        """Forget `name`. Requests already holding it finish with it; its slot empties
        once none runs."""
        adapter = self.adapters.pop(name, None)
        if adapter is None:
            raise ConfigError(f"lora '{name}' is not loaded{self._known()}")
        self.names = tuple(self.adapters)
        if adapter in self._slots:
            slot = self._slots.index(adapter)
            if self._refs[slot] == 0:
                self._empty(slot)

    def get(self, name: str) -> Adapter:
        adapter = self.adapters.get(name)
        if adapter is None:
            raise ConfigError(f"lora '{name}' is not loaded{self._known()}")
        return adapter

    def _known(self) -> str:
        return f" (loaded: {', '.join(self.adapters)})" if self.adapters else " (none loaded)"

    # -- slots (the scheduler) -------------------------------------------------------------
    def can_admit(self, adapter: Adapter | None) -> bool:
        """Whether a request for `adapter` can join the batch now."""
        return adapter is None or adapter in self._slots or 0 in self._refs

    def acquire(self, req: Any) -> None:
        """Give `req` (admitted) its adapter's slot, loading the adapter into a free one."""
        adapter = req.lora
        if adapter is None:
            return
        if adapter in self._slots:
            slot = self._slots.index(adapter)
        else:
            free = [s for s in range(self.max_loras) if self._refs[s] == 0]
            slot = min(free, key=lambda s: (self._slots[s] is not None, self._used[s]))
            self._load(slot, adapter)
        self._refs[slot] += 1
        self._used[slot] = next(self._clock)
        req.lora_slot = slot

    def release(self, req: Any) -> None:
        slot = getattr(req, "lora_slot", None)
        if slot is None:
            return
        req.lora_slot = None
        self._refs[slot] -= 1
        held = self._slots[slot]
        if self._refs[slot] == 0 and held is not None and held.name not in self.adapters:
            self._empty(slot)  # removed while in use

    def _load(self, slot: int, adapter: Adapter) -> None:
        self._slots[slot] = None  # empty, not the adapter it held, should the write fail
        self._bank.write(slot, adapter.spec.scaling, adapter.tensors)
        self._slots[slot] = adapter

    def _empty(self, slot: int) -> None:
        self._bank.clear(slot)
        self._slots[slot] = None

    def bank_bytes(self) -> int:
        """Bytes of the adapters resident in the bank's slots."""
        return self._bank.nbytes()

    def resident(self) -> list[str | None]:
        """The adapter name in each slot (None: empty)."""
        return [a.name if a is not None else None for a in self._slots]

    # -- the step --------------------------------------------------------------------------
    def token_slots(self, batch: Any) -> list[int] | None:
        """Each fed token's slot (-1: the base) in the runner's order; None when no chunk
        of the batch has an adapter."""
        if all(c.req.lora is None for c in batch.chunks):
            return None
        out: list[int] = []
        for c in batch.chunks:
            slot = c.req.lora_slot
            out.extend([-1 if slot is None else slot] * (c.n + len(c.draft)))  # + proposals
        return out

    def selection(self, token_slots: list[int] | None) -> LoraSelection | None:
        """What the step's forward carries to add each token's update (None: none)."""
        return self._bank.selection(token_slots)
