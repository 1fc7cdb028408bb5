"""Draft-model proposals: a smaller model sharing the tokenizer, with its own paged KV.

The draft keeps one sequence per speculating request in a pool of its own (the target's
page size and sizes, no radix cache). Before proposing it catches up on the tokens it has
not computed — the whole prompt the first time, then the tokens the last verify kept — in
the first of its k forwards; each forward feeds its previous proposal and draws the next
(greedy rows: its argmax; sampled rows: a draw from its own distribution q, which the
acceptance rule then needs). A proposal the target rejected is forgotten: the draft's
computed length falls back to the longest prefix it shares with the request's tokens, so
the rejected tokens' slots are rewritten by the next catch-up. Where the target's decode steps
run native (astrai.infer.native_step), the draft's one-token forwards do too.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from astrai.errors import ConfigError
from astrai.infer.cache.pool import KVHandle, PagePool
from astrai.infer.config import CacheConfig
from astrai.infer.decode_path import DecodePath
from astrai.infer.native_step import NativeDecodeStep
from astrai.infer.request import Request
from astrai.infer.runner import ModelRunner
from astrai.infer.scheduler import Chunk, StepBatch
from astrai.model import fast_path
from astrai.model.context import AttentionBackend

Draw = Callable[[torch.Tensor, list[Request], int], tuple[list[int], list[torch.Tensor | None]]]
"""(draft logits [B, V], their requests, proposal index j) -> (tokens, each row's q or None)."""


class DraftSeq:
    """The draft's copy of one request: its tokens (the request's, then proposals) and KV."""

    __slots__ = ("base", "kv", "num_computed", "tokens")

    def __init__(self, kv: KVHandle) -> None:
        self.kv = kv
        self.tokens: list[int] = []
        self.num_computed = 0
        self.base = 0
        """How many leading tokens are the request's own (the rest are proposals)."""


class DraftProposer:
    def __init__(self, model: torch.nn.Module, cache_config: CacheConfig, *, vocab_size: int,
                 max_context: int, dtype: torch.dtype, device: torch.device,
                 kernels: fast_path.DecodeKernels | None = None, native: bool = False) -> None:
        cfg = model.config
        if cfg.vocab_size != vocab_size:
            raise ConfigError(f"speculative model: vocab_size {cfg.vocab_size} differs from "
                              f"the model's {vocab_size}: use a draft sharing its tokenizer")
        if cfg.max_seq_len < max_context:
            raise ConfigError(f"speculative model: max_seq_len {cfg.max_seq_len} is shorter "
                              f"than the context {max_context}: lower --max-context")
        self.model = model.eval()
        self.pool = PagePool(cache_config.model_copy(update={"radix": False}),
                             n_layers=cfg.n_layers, n_kv_heads=cfg.kv_heads,
                             head_dim=cfg.hdim, max_context=max_context,
                             dtype=cache_config.torch_dtype(dtype), device=device)
        self.runner = ModelRunner(self.model, self.pool, kernels)
        step = NativeDecodeStep.create(self.model, self.pool, self.runner.head_operands,
                                       kernels, "auto" if native else "eager")
        self.path = DecodePath("native" if step else "eager", self.runner, step)
        """The draft's forwards: native where the target's are, checked like the target's
        on its first step (astrai.infer.decode_path)."""
        self.seqs: dict[str, DraftSeq] = {}

    def release(self, live: set[str]) -> None:
        """Free the sequences of requests no longer running (finished or preempted)."""
        for rid in [r for r in self.seqs if r not in live]:
            self.release_one(rid)

    def release_one(self, request_id: str) -> None:
        seq = self.seqs.pop(request_id, None)
        if seq is not None:
            self.pool.close(seq.kv)

    def _sync(self, req: Request) -> DraftSeq | None:
        """The request's sequence, its computed length cut back to what still matches."""
        s = self.seqs.get(req.id)
        if s is None:
            kv = self.pool.open(())
            if kv is None:
                return None
            s = self.seqs[req.id] = DraftSeq(kv)
        t = req.tokens
        common = min(s.base, s.num_computed)
        while common < s.num_computed and common < len(t) and s.tokens[common] == t[common]:
            common += 1
        s.num_computed = min(common, len(t) - 1)
        s.tokens, s.base = list(t), len(t)
        return s

    @torch.inference_mode()
    def propose(self, items: list[tuple[Request, int]], backend: AttentionBackend,
                draw: Draw) -> dict[str, tuple[list[int], list[torch.Tensor | None]]]:
        """(request, k) pairs -> per request id its proposals and their q rows (fewer than
        k, or none, where the draft's pool is short)."""
        active = [(r, s, k) for r, k in items if (s := self._sync(r)) is not None]
        out: dict[str, tuple[list[int], list]] = {r.id: ([], []) for r, _, _ in active}
        for j in range(max((k for _, _, k in active), default=0)):
            chunks, reqs = [], []
            for r, s, k in active:
                n = len(s.tokens) - s.num_computed
                if len(out[r.id][0]) < k and self.pool.reserve(s.kv, s.num_computed + n):
                    chunks.append(Chunk(s, s.num_computed, n, True))
                    reqs.append((r, s))
            if not chunks:
                break
            step = StepBatch(chunks)
            logits = self.path.run(step, backend)
            tokens, qs = draw(logits, [r for r, _ in reqs], j)
            for (r, s), tok, q in zip(reqs, tokens, qs):
                s.num_computed = len(s.tokens)
                s.tokens.append(tok)
                out[r.id][0].append(tok)
                out[r.id][1].append(q)
            active = [(r, s, k) for r, s, k in active if any(r is x for x, _ in reqs)]
        return out
