"""LoRA: low-rank adapters on a frozen model (Hu et al. 2021, "LoRA: Low-Rank Adaptation
of Large Language Models"), applied to a plain model by a function, as torchtitan applies
parallelism:

    y = W x + b + (alpha / r) · B A dropout(x)      A [r, in], B [out, r]

Initialisation follows PEFT's LoraLayer: A ~ kaiming_uniform(a=√5), B = 0, so a fresh
adapter changes nothing; `use_rslora` scales by alpha / √r instead (Kalajdzievskiy 2023,
"A Rank Stabilization Scaling Factor for Fine-Tuning with LoRA"). Adapters stay fp32
whatever dtype the base is moved to (their AdamW moments follow), and the layer computes
the update in fp32 and casts it back, as PEFT does.

    apply_lora(model, LoraSpec(rank=8, alpha=16, targets=("all-linear",)), seed=0)
    with adapters_disabled(model): ...     # the base model, no second copy (DPO reference)
    merge_lora(model)                      # plain nn.Linear layers with W + s·BA

State-dict names: the base keeps its own (`layers.0.attn.q_proj.weight`); the adapter adds
`layers.0.attn.q_proj.lora_A.weight` [r, in] and `.lora_B.weight` [out, r] (PEFT's names
under its `base_model.model.` prefix, see astrai/model/adapter.py).
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from astrai.errors import ConfigError
from astrai.model import fast_path, lora_batch
from astrai.model.context import ForwardContext

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear layers of a decoder block that can carry an adapter (HF Llama's names)."""
ALL_LINEAR = "all-linear"
BLOCK_PART = re.compile(r"(^|\.)layers\.\d+\.(attn|mlp)$")
"""A decoder block's attention or dense FFN: the modules whose linear layers adapt."""


@dataclass(frozen=True)
class LoraSpec:
    """What adapters a model gets."""

    rank: int
    """r: the inner dimension of B A."""
    alpha: float
    """The update is scaled by alpha / r (alpha / √r with rslora)."""
    dropout: float = 0.0
    """Dropout probability on the input of A (training only)."""
    targets: tuple[str, ...] = TARGETS
    """Leaf names of the adapted linear layers (a subset of TARGETS)."""
    rslora: bool = False
    """Scale by alpha / √r (rank-stabilised LoRA)."""

    @property
    def scaling(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)

    @classmethod
    def build(cls, rank: int, alpha: float | None = None, dropout: float = 0.0,
              targets: list[str] | tuple[str, ...] = (ALL_LINEAR,), *,
              field: str = "lora_targets") -> LoraSpec:
        """A validated spec; alpha None = 2·rank. Errors name `field`."""
        if rank <= 0:
            raise ConfigError(f"lora_rank: {rank} must be a positive integer")
        if not 0 <= dropout < 1:
            raise ConfigError(f"lora_dropout: {dropout} must be in [0, 1)")
        return cls(rank, float(2 * rank if alpha is None else alpha), float(dropout),
                   resolve_targets(targets, field=field))


def resolve_targets(targets: list[str] | tuple[str, ...], *, field: str = "lora_targets"
                    ) -> tuple[str, ...]:
    """`all-linear` or names from TARGETS (comma-separated items allowed), in TARGETS order."""
    names = {t.strip() for item in targets for t in str(item).split(",") if t.strip()}
    if ALL_LINEAR in names:
        return TARGETS
    unknown = sorted(names - set(TARGETS))
    if unknown or not names:
        raise ConfigError(f"{field}: {', '.join(unknown) or 'nothing'} is not a LoRA target; "
                          f"use {ALL_LINEAR} or names from {','.join(TARGETS)}")
    return tuple(t for t in TARGETS if t in names)


class LoRALinear(nn.Linear):
    """An nn.Linear (same `weight` and `bias` parameters, frozen) plus a LoRA update."""

    def __init__(self, base: nn.Linear, spec: LoraSpec,
                 generator: torch.Generator | None = None) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias
        for p in (self.weight, self.bias):
            if p is not None:
                p.requires_grad_(False)
        dev = base.weight.device
        self.lora_A = nn.Linear(self.in_features, spec.rank, bias=False, device=dev,
                                dtype=torch.float32)
        self.lora_B = nn.Linear(spec.rank, self.out_features, bias=False, device=dev,
                                dtype=torch.float32)
        # PEFT's init_lora_weights=True: A kaiming-uniform as nn.Linear's default, B zero
        with torch.no_grad():
            if generator is not None and dev.type == "cpu":
                nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5), generator=generator)
            else:
                nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
            nn.init.zeros_(self.lora_B.weight)
        self.dropout = nn.Dropout(spec.dropout) if spec.dropout > 0 else nn.Identity()
        self.scaling = spec.scaling
        self.enabled = True
        """False inside `adapters_disabled`: the layer is its base."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return F.linear(x, self.weight, self.bias)
        a = self.lora_A.weight
        x2 = x.reshape(-1, self.in_features)  # (N, in), N = all leading dims
        out = F.linear(x2, self.weight, self.bias)  # (N, out)
        xa = F.linear(self.dropout(x2).to(a.dtype), a)  # (N, r)
        if xa.dtype == out.dtype:
            # out += s · xa Bᵀ inside the GEMM (beta = 1): no [N, out] temporary, no extra
            # pass to add it, and the scale lands on the rank-r side in backward too (grads
            # of xa and B), not on an [N, out] gradient. In place is safe: linear's
            # backward does not need its output.
            out.addmm_(xa, self.lora_B.weight.t(), alpha=self.scaling)
        else:  # a bf16 base: the update in fp32, added in the base's dtype (as PEFT does)
            out = out + (F.linear(xa, self.lora_B.weight) * self.scaling).to(out.dtype)
        return out.view(*x.shape[:-1], self.out_features)

    def _apply(self, fn, recurse=True):
        # Adapters stay fp32 when the base moves to bf16 (their moments follow them).
        super()._apply(fn, recurse)
        for m in (self.lora_A, self.lora_B):
            if m.weight.dtype != torch.float32:
                m.weight.data = m.weight.data.float()
        return self

    def delta(self) -> torch.Tensor:
        """[out, in] fp32: the update s·B A the adapter adds to the weight."""
        return (self.lora_B.weight.float() @ self.lora_A.weight.float()) * self.scaling

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"rank={self.lora_A.out_features}, scaling={self.scaling:g}")


def project(x: torch.Tensor, layer: nn.Module, ctx: ForwardContext | None = None
            ) -> torch.Tensor:
    """layer(x) as F.linear on a plain layer's parameters (no module call, see block.py;
    a few rows may take a decode kernel of `ctx.kernels`, fast_path.py), or through the
    layer when it is anything else: an adapter, int8 weights (quant.py, which takes the
    kernels too). In an engine step with adapters selected per token (`ctx.lora`,
    lora_batch.py), their updates are added."""
    kernels = ctx.kernels if ctx is not None else None
    if type(layer) is nn.Linear and not _hooked(layer):
        y = fast_path.linear(x, layer.weight, layer.bias, kernels)
    elif kernels is not None and "qweight" in layer._buffers:  # quant.Int8Linear
        y = layer(x, kernels)
    else:
        y = layer(x)
    sel = ctx.lora if ctx is not None else None
    return y if sel is None else lora_batch.apply(sel, x, layer, y)


def _hooked(layer: nn.Module) -> bool:
    """A layer with forward hooks is called as a module: tensor parallelism
    (torch.distributed.tensor.parallel) moves its input and output between DTensor
    layouts in them."""
    return bool(layer._forward_pre_hooks or layer._forward_hooks)


def project_many(x: torch.Tensor, layers: tuple[nn.Module, ...],
                 ctx: ForwardContext | None = None) -> list[torch.Tensor]:
    """[project(x, layer, ctx) for layer in layers], in one call of a decode kernel of
    `ctx.kernels` where it takes them all (fast_path.py)."""
    kernels = ctx.kernels if ctx is not None else None
    out = fast_path.project_many(x, layers, kernels) if kernels is not None else None
    if out is None:
        return [project(x, m, ctx) for m in layers]
    sel = ctx.lora
    return out if sel is None else [lora_batch.apply(sel, x, m, y) for m, y in zip(layers, out)]


def lora_layers(model: nn.Module) -> Iterator[tuple[str, LoRALinear]]:
    """(module name, layer) of every adapted layer."""
    for name, m in model.named_modules():
        if isinstance(m, LoRALinear):
            yield name, m


def has_lora(model: nn.Module) -> bool:
    return next(lora_layers(model), None) is not None


def apply_lora(model: nn.Module, spec: LoraSpec, *, seed: int = 0,
               train_also: tuple[str, ...] = ()) -> nn.Module:
    """Freeze `model` and put an adapter on every linear layer of a decoder block named in
    spec.targets (never the embeddings, the LM head, an MoE router or expert). Parameters
    whose names start with one of `train_also` stay trainable (a reward model's new head).
    In place; returns the model. A seeded generator draws A, so the adapter's init does not
    depend on what drew from the global RNG before."""
    if getattr(getattr(model, "config", None), "n_experts", 0):
        raise ConfigError("lora_rank: LoRA on mixture-of-experts models is not supported; "
                          "drop --lora-rank or train a dense model")
    if has_lora(model):
        raise ConfigError("lora_rank: the model already carries adapters")
    for name, p in model.named_parameters():
        p.requires_grad_(any(name.startswith(k) for k in train_also))
    gen = torch.Generator().manual_seed(seed)
    found = 0
    for parent_name, parent in list(model.named_modules()):
        if not BLOCK_PART.search(parent_name):
            continue
        for leaf, child in list(parent.named_children()):
            if leaf in spec.targets and type(child) is nn.Linear:
                setattr(parent, leaf, LoRALinear(child, spec, gen))
                found += 1
    if not found:
        raise ConfigError(f"lora_targets: no layer of the model is named "
                          f"{', '.join(spec.targets)}")
    model.lora_spec = spec  # what the PEFT adapter_config.json of this model says
    return model


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block the model computes its base (PEFT's `disable_adapter()`)."""
    layers = [m for _, m in lora_layers(model)]
    before = [m.enabled for m in layers]
    for m in layers:
        m.enabled = False
    try:
        yield model
    finally:
        for m, was in zip(layers, before):
            m.enabled = was


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter tensors under astrai names (`....q_proj.lora_A.weight`)."""
    return {k: v for k, v in model.state_dict().items() if is_lora_key(k)}


def is_lora_key(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


@torch.no_grad()
def merge_lora(model: nn.Module) -> nn.Module:
    """Replace every adapted layer by a plain nn.Linear holding W + s·B A (in the base
    weight's dtype, summed in fp32). In place; returns the model."""
    for name, layer in list(lora_layers(model)):
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        w = layer.weight
        merged = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None,
                           device=w.device, dtype=w.dtype)
        merged.weight.copy_((w.float() + layer.delta().to(w.device)).to(w.dtype))
        if layer.bias is not None:
            merged.bias.copy_(layer.bias)
        merged.requires_grad_(w.requires_grad)
        setattr(parent, leaf, merged)
    return model
