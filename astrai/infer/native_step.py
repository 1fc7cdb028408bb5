"""The native decode step: every block of the model for a step's few query rows in one call
of astrai's CPU kernels (csrc/cpu/decode_layers.h), then the LM head.

On a CPU a decode step of a small model costs more in per-operator overhead — a Python call,
a dispatch and an allocation for each norm, RoPE, K/V write, residual add and SwiGLU of each
layer — than in reading its weights; the native step runs the whole stack of blocks as one
operator over the same weights, K/V pool and kernels (figures in docs/engine.md "Native
decode step"). It takes the steps in which every request brings one query token (a decode)
or its token and k proposals (a speculative verify: k + 1 rows of consecutive positions,
each attending causally over the pool, vLLM's way of verifying as a decode of several
queries), up to the kernels' row limit; every other step — prefill, adapters' rows, more
rows — runs the ragged eager path, as does a model it cannot serve (`unsupported`).

The model's own tables give the RoPE factors (every rope scaling) and its embedding the
rows' inputs; the LM head (`ModelRunner.head_operands`) runs in the same call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from astrai.infer.cache.pool import PagePool
from astrai.infer.scheduler import StepBatch
from astrai.model import fast_path
from astrai.model.attention import Attention
from astrai.model.block import DecoderBlock
from astrai.model.features import ANY, only, refusal, window_covers_context
from astrai.model.mlp import SwiGLU
from astrai.model.norm import RMSNorm
from astrai.model.quant import Int8Linear
from astrai.model.quant4 import Int4Linear
from astrai.model.transformer import Transformer

log = logging.getLogger("astrai.infer")

NATIVE_FEATURES = {
    "norm_eps": ANY,            # passed to every norm of decode_layers
    "tie_embeddings": ANY,      # the head's operands come from ModelRunner.head_operands
    "qkv_bias": ANY,            # slots 7-9 of a block
    "qk_norm": ANY,             # slots 10-11
    "sliding_window": window_covers_context,   # decode_layers attends to the whole context
    "n_experts": only(0), "n_shared_experts": only(0), "moe_top_k": ANY, "moe_layers": ANY,
}
"""The model features decode_layers.h implements (astrai.model.features); RoPE of every
scaling comes in through the model's own tables. A feature not listed here sends the
engine to another path, never to a wrong answer."""


KV_DTYPES = {torch.float32: (torch.float32, torch.bfloat16, torch.float16),
             torch.bfloat16: (torch.bfloat16,)}
"""The KV pool dtypes decode_layers takes under each activation dtype: fp32 activations
over a 16-bit pool (llama.cpp's default f16 cache) write K/V rounded to it and attend in
fp32."""


def _linear(m: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(weight or quantized values, their scales or None, bias or None) of a plain, int8 or
    int4 layer (decode_gemv.cpp's `make_product` tells the formats apart by the values'
    dtype)."""
    if type(m) is nn.Linear:
        return m.weight, None, m.bias
    return m.qweight, m.scale, m.bias


def _layer_unsupported(m: nn.Module, dtype: torch.dtype) -> str | None:
    if type(m) is nn.Linear:
        return None if m.weight.dtype == dtype else f"{m.weight.dtype} weights"
    if type(m) in (Int8Linear, Int4Linear):
        return None
    return f"{type(m).__name__} layers (e.g. an unmerged adapter)"


def _own_code(model: nn.Module) -> str | None:
    """A subclass or a hook that changes what a forward computes (the engine runs the
    model's own forward: docs/architecture.md), or None for astrai's stock modules."""
    stock = (Transformer, DecoderBlock, Attention, SwiGLU, RMSNorm, nn.Linear, nn.Embedding,
             nn.ModuleList, Int8Linear, Int4Linear)
    for m in model.modules():
        if type(m) not in stock:
            return f"{type(m).__name__} modules (their own forward)"
        if m._forward_hooks or m._forward_pre_hooks:
            return f"forward hooks on {type(m).__name__}"
    return None


def unsupported(model: nn.Module, pool: PagePool, kernels: fast_path.DecodeKernels | None
                ) -> str | None:
    """Why the native step cannot run this model on this pool, or None."""
    if kernels is None or None in (getattr(kernels, "decode_layers", None),
                                   getattr(kernels, "decode_plan", None)):
        return "no CPU decode kernels"
    if (why := _own_code(model)) is not None:
        return why
    why = refusal(model.config, NATIVE_FEATURES, pool.max_context, "native CPU step")
    if why is not None:
        return why
    dtype, kv = next(model.parameters()).dtype, pool.storage.k.dtype
    if dtype not in (torch.float32, torch.bfloat16) or kv not in KV_DTYPES[dtype]:
        return f"{dtype} activations over a {kv} KV pool"
    for block in model.layers:
        a, f = block.attn, block.mlp
        for m in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, f.gate_proj, f.up_proj, f.down_proj):
            why = _layer_unsupported(m, dtype)
            if why is not None:
                return why
    return None


def block_weights(block: nn.Module) -> dict[str, torch.Tensor | None]:
    """One block's weights by decode_layers' slot names (the `slot_names` op of
    csrc/cpu/decode_layers.h): None where the block has no such weight."""
    a, f = block.attn, block.mlp
    out: dict[str, torch.Tensor | None] = {"attn_norm": block.attn_norm.weight,
                                           "mlp_norm": block.mlp_norm.weight}
    for name, m in (("q", a.q_proj), ("k", a.k_proj), ("v", a.v_proj), ("o", a.o_proj),
                    ("gate", f.gate_proj), ("up", f.up_proj), ("down", f.down_proj)):
        out[name], out[f"{name}_scale"], bias = _linear(m)
        if name in ("q", "k", "v"):
            out[f"{name}_bias"] = bias
    out["q_norm"] = a.q_norm.weight if a.q_norm is not None else None
    out["k_norm"] = a.k_norm.weight if a.k_norm is not None else None
    return out


def pack_weights(model: nn.Module, slots: tuple[str, ...]) -> list[torch.Tensor | None]:
    """The blocks' weights in decode_layers' order: per block, one per slot name of
    `slots` (DecodeKernels.layer_slots, read from the library), so Python and C++ agree
    on the order by name; a slot Python does not fill, or a weight C++ has no slot for,
    raises."""
    out: list[torch.Tensor | None] = []
    for block in model.layers:
        named = block_weights(block)
        if set(named) != set(slots):
            raise RuntimeError(f"decode_layers' slots {sorted(slots)} differ from the block's "
                               f"weights {sorted(named)}")
        out += [named[s] for s in slots]
    return out


def max_rows(q_proj: nn.Module, kernels: fast_path.DecodeKernels) -> int:
    """The most rows a step takes: the kernels' row limit for the blocks' weight format
    (int8 values, bf16 or fp32), beyond which their products would go to torch's GEMM."""
    q_weight = _linear(q_proj)[0]
    if q_weight.dtype == torch.int8:
        return kernels.int8_rows[1]
    if q_weight.dtype == torch.uint8:
        return kernels.int4_rows[1]
    return (kernels.bf16_rows if q_weight.dtype == torch.bfloat16 else kernels.fp32_rows)[1]


class NativeDecodeStep:
    """Runs decode and verify steps through decode_layers (see the module docstring)."""

    verifies = True
    """Takes speculative verify rows (astrai.infer.decode_path)."""

    def __init__(self, model: nn.Module, pool: PagePool,
                 head: Callable[[fast_path.DecodeKernels], list[torch.Tensor | None]],
                 kernels: fast_path.DecodeKernels) -> None:
        self.model, self.pool, self.head, self.kernels = model, pool, head, kernels
        cfg = model.config
        self.max_rows = max_rows(model.layers[0].attn.q_proj, kernels)
        shape = [cfg.n_heads, cfg.kv_heads, cfg.hdim, *kernels.fp32_rows, *kernels.bf16_rows,
                 int(kernels.int8_quantized)]
        self.plan = kernels.decode_plan(pack_weights(model, kernels.layer_slots), shape,
                                        float(cfg.norm_eps), model.embed_tokens.weight,
                                        model.norm.weight)
        """The blocks' weights as decode_layers takes them, checked once: it reads their
        storage, so in-place updates are seen (a model whose tensors are replaced needs a
        new step, as an engine does for each rollout)."""

    @classmethod
    def create(cls, model: nn.Module, pool: PagePool,
               head: Callable[[fast_path.DecodeKernels], list[torch.Tensor | None]],
               kernels: fast_path.DecodeKernels | None, mode: str) -> NativeDecodeStep | None:
        """The step for `mode` auto or native where it can serve the model, else None;
        `head` gives the LM head's operands (ModelRunner.head_operands); a plan that
        refuses the weights (one warning) leaves the step to the eager path."""
        if mode not in ("auto", "native") or unsupported(model, pool, kernels) is not None:
            return None
        try:
            return cls(model, pool, head, kernels)
        except RuntimeError as e:  # decode_plan refused a weight: the eager path serves it
            log.warning("decode path native refused, running eager: %s", e)
            return None

    def accepts(self, batch: StepBatch) -> bool:
        """Every request samples after one token (and its proposals), within the row limit."""
        return (batch.num_tokens <= self.max_rows
                and all(c.n == 1 and c.sample for c in batch.chunks))

    def _rows(self, batch: StepBatch) -> torch.Tensor:
        """[5, N] int64: each row's token id, position, request row, KV length and slot."""
        P = self.pool.page_size
        ids, pos, rows, lens, slots = [], [], [], [], []
        for c in batch.chunks:
            req, p0 = c.req, c.start
            ids.append(req.tokens[p0])
            ids.extend(c.draft)
            for p in range(p0, p0 + 1 + len(c.draft)):
                pos.append(p)
                rows.append(req.kv.row)
                lens.append(p + 1)
                slots.append(req.kv.pages[p // P] * P + p % P)
        return torch.tensor([ids, pos, rows, lens, slots], dtype=torch.int64)

    def run(self, batch: StepBatch) -> torch.Tensor:
        """fp32 logits [N, V] of every row, in chunk order (a verify: 1 + k rows)."""
        return self.forward(self._rows(batch))

    @torch.inference_mode()
    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        """fp32 logits [N, V] of rows [5, N] (`_rows`' layout)."""
        m, st = self.model, self.pool.storage
        return self.kernels.decode_layers(self.plan, rows, m.rope_cos, m.rope_sin, st.k, st.v,
                                          self.pool.req_to_token.table,
                                          self.head(self.kernels))
