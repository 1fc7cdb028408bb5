"""astrai measured as llama.cpp's llama-bench and llama-batched-bench measure llama.cpp.

  pp512   one request of 512 prompt tokens: 512 / the time from submitting it to its first
          token (llama-bench `-p 512`: one batch of 512 tokens decoded, its logits made)
  tg128   one request of one prompt token, then 128 generated tokens: 128 / the time from its
          first token to its last (llama-bench `-n 128`: 128 single-token decodes from an empty
          context)
  4 concurrent (llama-batched-bench `-npp 512 -ntg 128 -npl 4`): four requests of 512 distinct
          prompt tokens submitted together; pp = 4·512 / the time until all four have their
          first token, tg = 4·128 / the time from then until the last finishes

Every prompt is fresh random ids (a prompt seen before would be served from the prefix cache,
which llama-bench never does), greedy, EOS ignored. The KV cache is 16-bit, as llama.cpp's
default f16 cache: float16 under fp32, int8 and int4 weights (`--kv-cache-dtype float16`),
bf16 under bf16 weights.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from astrai.infer import CacheConfig, Engine, SamplingParams, SchedulerConfig
from astrai.infer.build import EngineOptions, build_engine

PP, TG, CONCURRENT = 512, 128, 4


@dataclass
class Figures:
    """Tokens/s of one measurement; None where not measured."""

    pp: float | None = None
    tg: float | None = None


def engine(model: torch.nn.Module, huge_pages: bool) -> Engine:
    """The engine chat, serve and serve-bench build (`huge_pages`: the weights moved into
    2 MiB transparent huge pages, as those commands do for a model they load)."""
    fp32 = next(model.parameters()).dtype == torch.float32
    cache = CacheConfig(page_size=16, max_kv_tokens=CONCURRENT * (PP + TG + 32),
                        max_requests=CONCURRENT, dtype="float16" if fp32 else None)
    # one step takes all four prompts at once, as llama.cpp's n_batch 2048 does
    return build_engine(model, None, EngineOptions(), cache, huge_pages=huge_pages,
                        scheduler=SchedulerConfig(max_step_tokens=CONCURRENT * PP))


class Prompts:
    """Fresh random prompts from a seeded generator."""

    def __init__(self, vocab: int, seed: int = 0) -> None:
        self.vocab = vocab
        self.g = torch.Generator().manual_seed(seed)

    def __call__(self, n: int) -> list[int]:
        return torch.randint(3, self.vocab, (n,), generator=self.g).tolist()


def run(eng: Engine, prompts: list[list[int]], new: int) -> tuple[float, float, float]:
    """(submit time, time every request had its first token, time the last finished)."""
    t0 = time.perf_counter()
    ids = {eng.add_request(p, SamplingParams.greedy(new, ignore_eos=True)) for p in prompts}
    started: set[str] = set()
    t_first = None
    while eng.has_unfinished():
        for out in eng.step():
            if out.request_id in ids and out.token_ids:
                started.add(out.request_id)
        if t_first is None and len(started) == len(ids):
            t_first = time.perf_counter()
    return t0, t_first or time.perf_counter(), time.perf_counter()


def measure(eng: Engine, prompts: Prompts, batch: int, pp: bool = True) -> Figures:
    """pp512 and tg128 (`pp` False: tg128 alone). One request: two runs, as llama-bench's
    two tests (tg128 from a one-token prompt); 4 concurrent: one run, as
    llama-batched-bench's (its prompts, then its 128 tokens each)."""
    if batch > 1:
        t0, t1, t2 = run(eng, [prompts(PP) for _ in range(batch)], TG + 1)
        return Figures(batch * PP / (t1 - t0), batch * TG / (t2 - t1))
    fig = Figures()
    if pp:
        t0, t1, _ = run(eng, [prompts(PP)], 1)
        fig.pp = PP / (t1 - t0)
    _, t1, t2 = run(eng, [prompts(1)], TG + 1)
    fig.tg = TG / (t2 - t1)
    return fig


def warm_up(eng: Engine, prompts: Prompts) -> None:
    """One short request of each kind (llama-bench's own warm-up run does the same): the
    kernels built, the weights touched once."""
    run(eng, [prompts(PP)], 2)
    run(eng, [prompts(1)], 8)
