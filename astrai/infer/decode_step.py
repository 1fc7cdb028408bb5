"""The static-shape decode step: every request brings one token, the shapes never change.

A pure decode step of B requests runs in the smallest batch bucket >= B (1, 2, 4, 8, then
multiples of 16 up to the engine's request limit, as nano-vllm and vLLM size theirs).
Each bucket's inputs live in buffers allocated once — token ids, positions, request rows,
KV lengths, the slots the new K/V go to — and one small host-to-device copy fills them;
rows past B are padding: they write their K/V into the pool's scratch page and read one
slot, and their logits are dropped. Attention is `paged_decode` over the req_to_token
table (astrai's CUDA kernel; its torch reference elsewhere), whose launch depends only on
the shapes, so on CUDA each bucket's whole forward and LM head is captured once as a CUDA
graph and replayed: one launch per step instead of one per operator (docs/engine.md
"Decode step").

Modes: `graphs` (CUDA: capture per bucket at first use), `static` (the same buffers and
attention, run eagerly: what the tests compare with the eager path on CPU), `eager` (the
ragged runner for every step). `auto` is graphs on CUDA when the kernels serve the
model's head size and dtype, eager otherwise: on a CPU the ragged path is as fast
(per-operator overhead is small there; figures in docs/engine.md).
"""

from __future__ import annotations

from typing import Literal

import torch

from astrai.infer.backends.base import write_kv
from astrai.infer.cache.pool import PagePool
from astrai.infer.cache.record import KVCache
from astrai.infer.scheduler import StepBatch
from astrai.kernels import library as kernel_lib
from astrai.kernels.ops import paged_decode
from astrai.model import fast_path
from astrai.model.context import ForwardContext
from astrai.model.features import ANY, only, refusal, window_covers_context

DecodeMode = Literal["auto", "graphs", "static", "eager", "native"]
DECODE_MODES: tuple[str, ...] = ("auto", "graphs", "static", "eager", "native")


def decode_buckets(max_batch: int) -> list[int]:
    """Batch sizes with a static step: 1, 2, 4, 8, 16, 32, ... (multiples of 16 after 8),
    up to and including max_batch."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch] + list(range(16, max_batch, 16))
    return sorted(set(sizes + [max_batch]))


class StaticDecodeAttention:
    """The decode step's attention: write the new K/V, then `paged_decode` (no host
    values: the same launches for every step of a bucket)."""

    name = "static_decode"

    def supports(self, q: torch.Tensor, ctx: ForwardContext) -> str | None:
        return None

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
               ctx: ForwardContext) -> torch.Tensor:
        c = ctx.cache
        write_kv(k, v, layer, ctx)
        args = (q[0], c.k_buf[layer], c.v_buf[layer], c.req_to_token, c.req_pool_indices,
                c.seq_lens, q.shape[-1] ** -0.5)
        out = fast_path.paged_decode(ctx.kernels, *args)  # a CPU kernel, where the step has one
        if out is None:
            out = paged_decode(*args)
        return out.unsqueeze(0)  # (1, B, H, D)


def resolve_decode_mode(mode: str, model: torch.nn.Module, pool: PagePool) -> str:
    """The mode a step will run: `auto` resolved, and graphs/static refused (-> eager)
    where the static step cannot serve the model or pool (the reason is not an error: the
    eager path serves everything)."""
    if mode not in DECODE_MODES:
        raise ValueError(f"decode mode '{mode}': choose one of {', '.join(DECODE_MODES)}")
    if mode in ("eager", "native") or static_unsupported(model, pool) is not None:
        return "eager"
    on_cuda = pool.storage.k.device.type == "cuda"
    if mode == "auto":
        return "graphs" if on_cuda and _kernel_serves(model, pool) else "eager"
    if mode == "graphs" and not (on_cuda and _kernel_serves(model, pool)):
        # a capture needs the CUDA kernel (its torch reference reads lengths on the host);
        # the same step runs eagerly instead
        return "static"
    return mode


def _kernel_serves(model: torch.nn.Module, pool: PagePool) -> bool:
    """astrai's paged_decode kernel builds and serves this model's heads and KV dtype."""
    try:
        kernel_lib.get_library()
    except kernel_lib.KernelUnavailable:
        return False
    k = pool.storage.k
    q = torch.empty(1, model.config.n_heads, model.config.hdim, dtype=k.dtype, device=k.device)
    return kernel_lib.decode_supported(q, k[0]) is None


def static_unsupported(model: torch.nn.Module, pool: PagePool) -> str | None:
    """Why the static step cannot run this model on this pool, or None."""
    cfg = model.config
    if pool.scratch_slot is None:
        return "contiguous KV pool (no scratch page for padding rows)"
    return refusal(cfg, STATIC_FEATURES, pool.max_context, "static decode step")


STATIC_FEATURES = {
    "norm_eps": ANY, "tie_embeddings": ANY, "qkv_bias": ANY, "qk_norm": ANY,
    # the decode kernel attends to the whole context
    "sliding_window": window_covers_context,
    # expert dispatch depends on the data: no static shapes
    "n_experts": only(0), "n_shared_experts": only(0), "moe_top_k": ANY, "moe_layers": ANY,
}
"""The model features the static step serves (astrai.model.features): it runs the model's
own forward, so every feature but these two."""


class DecodeStep:
    """Runs pure decode steps through per-bucket static buffers (and CUDA graphs)."""

    verifies = False
    """Speculative verify rows run eager (astrai.infer.decode_path)."""

    def __init__(self, model: torch.nn.Module, pool: PagePool, lm_head, mode: str,
                 max_batch: int, kernels: fast_path.DecodeKernels | None = None) -> None:
        self.model, self.pool, self.lm_head, self.kernels = model, pool, lm_head, kernels
        self.mode = resolve_decode_mode(mode, model, pool)
        self.buckets = decode_buckets(max_batch)
        dev = pool.storage.k.device
        n = self.buckets[-1]
        self.inputs = torch.zeros(4, n, dtype=torch.int64, device=dev)
        """Rows: token ids, positions, request rows, slots of the new K/V."""
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=dev)
        self.attention = StaticDecodeAttention()
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.graph_pool = None

    @property
    def enabled(self) -> bool:
        return self.mode in ("graphs", "static")

    def accepts(self, batch: StepBatch) -> bool:
        """A pure decode step (one sampled token per request, no proposals to verify) that
        fits the largest bucket."""
        return (self.enabled and len(batch.chunks) <= self.buckets[-1]
                and all(c.n == 1 and c.sample and not c.draft for c in batch.chunks))

    def run(self, batch: StepBatch) -> torch.Tensor:
        """fp32 logits [B, V] of the step's requests, in chunk order."""
        B = len(batch.chunks)
        bucket = next(b for b in self.buckets if b >= B)
        self._fill(batch, bucket)
        if self.mode == "graphs":
            graph, out = self.graphs.get(bucket) or self._capture(bucket)
            graph.replay()
            return out[:B].clone()
        return self._forward(bucket)[:B]

    def _fill(self, batch: StepBatch, bucket: int) -> None:
        """One host-to-device copy of the step's inputs; padding rows write the scratch slot
        and read one slot of row 0 (their outputs are dropped)."""
        P, pad = self.pool.page_size, bucket - len(batch.chunks)
        ids, pos, rows, locs, lens = [], [], [], [], []
        for c in batch.chunks:
            p = c.start
            ids.append(c.req.tokens[p])
            pos.append(p)
            rows.append(c.req.kv.row)
            locs.append(c.req.kv.pages[p // P] * P + p % P)
            lens.append(p + 1)
        host = torch.tensor([ids + [0] * pad, pos + [0] * pad, rows + [0] * pad,
                             locs + [self.pool.scratch_slot] * pad], dtype=torch.int64)
        self.inputs[:, :bucket].copy_(host, non_blocking=True)
        self.seq_lens[:bucket].copy_(torch.tensor(lens + [1] * pad, dtype=torch.int32),
                                     non_blocking=True)

    def _record(self, bucket: int) -> KVCache:
        st, dev = self.pool.storage, self.inputs.device
        ar = torch.arange(bucket + 1, dtype=torch.int32, device=dev)
        return KVCache(
            k_buf=st.k, v_buf=st.v, req_to_token=self.pool.req_to_token.table,
            req_pool_indices=self.inputs[2, :bucket], seq_lens=self.seq_lens[:bucket],
            qo_indptr=ar, kv_indptr=ar, out_cache_loc=self.inputs[3, :bucket], is_decode=True,
            positions=self.inputs[1, :bucket], page_size=self.pool.page_size)

    @torch.inference_mode()
    def _forward(self, bucket: int) -> torch.Tensor:
        record = self._record(bucket)
        ctx = ForwardContext(positions=record.positions[None], cache=record,
                             backend=self.attention, kernels=self.kernels)
        out = self.model(self.inputs[0, :bucket][None], ctx, return_hidden=True,
                         compute_logits=False)
        return self.lm_head(out.hidden[0]).float()  # (bucket, V)

    def _capture(self, bucket: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Warm the bucket up on a side stream, then capture its forward (the graphs share
        one memory pool, so every bucket costs about what the largest one does)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._forward(bucket)  # allocations and lazy inits happen outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.graph_pool):
            out = self._forward(bucket)
        self.graph_pool = graph.pool()
        self.graphs[bucket] = (graph, out)
        return graph, out
