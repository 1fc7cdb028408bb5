"""ModelRunner: turns a StepBatch into one forward pass of the model over the ragged tokens.

The step's tokens are flattened to input_ids [1, N]; the KV record is built once, and its
positions and the attention backend ride to every layer in the ForwardContext — the
model's own `Transformer.forward`, the same one training runs, computes the step. Only the
rows that sample (the last token of each finished chunk) go through the LM head: a prefill
of thousands of tokens costs one [B, V] projection, not [N, V].
"""

from __future__ import annotations

import torch

from astrai.infer.cache.pool import PagePool
from astrai.infer.cache.record import KVCache, build_kv_cache
from astrai.infer.scheduler import StepBatch
from astrai.model import fast_path
from astrai.model.context import AttentionBackend, ForwardContext
from astrai.model.lora_batch import LoraSelection


class ModelRunner:
    def __init__(self, model: torch.nn.Module, pool: PagePool,
                 kernels: fast_path.DecodeKernels | None = None) -> None:
        self.model = model
        self.pool = pool
        self.kernels = kernels
        """CPU decode kernels for the steps' few-row work (None: torch's), carried to the
        model in each step's ForwardContext."""
        self.device = pool.req_to_token.table.device
        self._head_t: torch.Tensor | None = None
        self._head_key: tuple | None = None

    def build_record(self, batch: StepBatch) -> tuple[list[int], list[int], KVCache]:
        ids: list[int] = []
        rows, prefix, qo, sample_rows, pages = [], [], [], [], []
        for c in batch.chunks:
            ids.extend(c.req.tokens[c.start:c.start + c.n])
            ids.extend(c.draft)  # speculative decoding: every proposal's row is sampled
            rows.append(c.req.kv.row)
            pages.append(c.req.kv.pages)
            prefix.append(c.start)
            qo.append(c.num_fed)
            if c.sample:
                sample_rows.extend(range(len(ids) - 1 - len(c.draft), len(ids)))
        st = self.pool.storage
        record = build_kv_cache(st.k, st.v, self.pool.req_to_token.table, rows, prefix, qo,
                                self.pool.page_size, pages)
        return ids, sample_rows, record

    @torch.inference_mode()
    def run(self, batch: StepBatch, backend: AttentionBackend,
            lora: LoraSelection | None = None) -> torch.Tensor:
        """Forward the step (`lora`: the adapters of its tokens, astrai.model.lora_batch);
        returns fp32 logits [n_sampling, V] of the sampling rows (a chunk with proposals has
        1 + len(draft) of them, in order)."""
        ids, sample_rows, record = self.build_record(batch)
        input_ids = torch.tensor(ids, dtype=torch.long).to(self.device)
        ctx = ForwardContext(positions=record.positions[None], cache=record, backend=backend,
                             kernels=self.kernels, lora=lora)
        out = self.model(input_ids[None], ctx, return_hidden=True, compute_logits=False)
        h = out.hidden[0]  # (N, C)
        if len(sample_rows) != h.shape[0]:
            h = h[torch.tensor(sample_rows, dtype=torch.long, device=self.device)]  # (B_s, C)
        return self.lm_head(h).float()

    def lm_head(self, h: torch.Tensor) -> torch.Tensor:
        """h [B_s, C] -> logits [B_s, V]. On CPU a one- or two-row product against the
        [V, C] head is faster against a [C, V] copy (figures in docs/engine.md
        "Performance"), and decoding a lone request is mostly that product. A CPU decode
        kernel of the runner's (model/fast_path.py) that takes the product reads the weight
        as it is."""
        k = self.kernels
        lm = getattr(self.model, "lm_head", None)
        if lm is not None and type(lm) is not torch.nn.Linear:  # int8 (model/quant.py)
            return lm(h, k) if k is not None else lm(h)
        w = lm.weight if lm is not None else self.model.output_weight()
        bias = lm.bias if lm is not None else None
        if (h.device.type != "cpu" or h.shape[0] > 2 or bias is not None
                or fast_path.takes(h, w, k)):  # a CPU decode kernel reads [V, C] as it is
            return fast_path.linear(h, w, bias, k)
        return h @ self._transposed(w)

    def head_operands(self, kernels: fast_path.DecodeKernels | None = None
                      ) -> list[torch.Tensor | None]:
        """The LM head as the native decode step takes it: [weight [V, C] (int8 values for an
        int8 head), int8 scale, bias, the [C, V] copy of an fp32 weight on the CPU or None].
        The copy is made only where one fp32 row stays off `kernels` (torch's GEMV chosen,
        astrai/kernels/cpu_choice.py): the BLAS's sgemv streams it faster than the [V, C]
        weight; elsewhere the kernel reads [V, C] as it is."""
        lm = getattr(self.model, "lm_head", None)
        if lm is not None and type(lm) is not torch.nn.Linear:  # int8 (model/quant.py)
            return [lm.qweight, lm.scale, lm.bias, None]
        w = lm.weight if lm is not None else self.model.output_weight()
        bias = lm.bias if lm is not None else None
        blas_row = kernels is None or kernels.fp32_rows[0] > 1
        copy = w.dtype == torch.float32 and w.device.type == "cpu" and blas_row
        return [w, None, bias, self._transposed(w) if copy else None]

    def _transposed(self, w: torch.Tensor) -> torch.Tensor:
        """The [C, V] copy of the head weight, refreshed whenever the weight changes
        (in-place updates bump _version)."""
        key = (id(w), w.data_ptr(), w._version, w.dtype)
        if key != self._head_key:
            self._head_t = w.detach().t().contiguous()  # (C, V)
            self._head_key = key
        return self._head_t
