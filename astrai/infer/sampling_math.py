"""Sampling math as pure functions over a batch of logits [B, V] with per-row settings.

Order (as in HF's logits processors and vLLM's sampler): penalties on the raw logits, then
temperature, then top-k, top-p and min-p masks (-inf), then a draw. Greedy rows take the
argmax of the penalized logits. Each function is tested against a naive per-row loop.
"""

from __future__ import annotations

import torch

from astrai.infer.params import GREEDY_BELOW

NEG_INF = float("-inf")


def apply_penalties(logits: torch.Tensor, counts: torch.Tensor, prompt_mask: torch.Tensor,
                    repetition: torch.Tensor, frequency: torch.Tensor,
                    presence: torch.Tensor) -> torch.Tensor:
    """logits [B, V]; counts [B, V] output-token counts; prompt_mask [B, V] bool;
    repetition/frequency/presence [B].

    Repetition (Keskar et al., 2019, CTRL §4.1; HF/vLLM semantics) hits every token seen in
    the prompt or output: a positive logit is divided by the penalty, a negative one
    multiplied. Frequency and presence (OpenAI) subtract from output tokens only."""
    seen = prompt_mask | (counts > 0)
    rep = repetition[:, None]
    logits = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
    return logits - frequency[:, None] * counts - presence[:, None] * (counts > 0).to(logits.dtype)


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """int32 [B, ceil(V/32)] bitmask (bit j of word w: token 32w + j) -> bool [B, V]."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab].bool()


def apply_token_mask(logits: torch.Tensor, rows: torch.Tensor, allowed: torch.Tensor
                     ) -> torch.Tensor:
    """`logits` with the tokens not `allowed` ([R, V] bool) of rows `rows` set to -inf."""
    out = logits.clone()
    out[rows] = out[rows].masked_fill(~allowed, float("-inf"))
    return out


def apply_temperature(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Divide row b by temperature[b]; greedy rows (temperature below GREEDY_BELOW) stay as
    they are."""
    t = torch.where(temperature >= GREEDY_BELOW, temperature, torch.ones_like(temperature))
    return logits / t[:, None]


def top_k_mask(logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Keep each row's k[b] largest logits (ties with the k-th kept); k <= 0 keeps all."""
    V = logits.shape[-1]
    k = torch.where((k <= 0) | (k > V), torch.full_like(k, V), k)
    kmax = int(k.max())
    top = logits.topk(kmax, dim=-1).values  # (B, kmax) descending
    thresh = top.gather(1, (k - 1).long()[:, None])  # (B, 1) the k-th largest
    return logits.masked_fill(logits < thresh, NEG_INF)


def top_p_mask(logits: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Nucleus (Holtzman et al., 2020): keep the smallest prefix of the tokens sorted by
    probability whose mass reaches p[b] (the top token always stays); p >= 1 keeps all."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability of the tokens ranked above
    drop_sorted = (mass_before >= p[:, None]) & (p[:, None] < 1.0)
    drop_sorted[:, 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    return logits.masked_fill(drop, NEG_INF)


def min_p_mask(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below min_p[b] times the row's top probability."""
    probs = logits.softmax(dim=-1)
    thresh = probs.max(dim=-1, keepdim=True).values * min_p[:, None]
    return logits.masked_fill(probs < thresh, NEG_INF)


def candidates(x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
               min_p: torch.Tensor, cap: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """What `top_k_mask`, `top_p_mask` and `min_p_mask` (in that order) leave of
    temperature-scaled logits x [B, V], over each row's `cap` largest logits only: (ids, w)
    [B, C], the candidate token ids and their logits (-inf where masked), C <= cap. None
    when a row's kept set might reach past its candidates: a row with neither top-k nor
    top-p (k <= 0, p >= 1), a top-k wider than `cap` or whose ties run past it, a top-p
    whose mass the `cap` largest do not reach. The masks are the same arithmetic on fewer
    tokens: the k-th largest value, the probabilities of the top-k set (of the whole row
    where no top-k applies: its log-normalizer over V), each token's mass ranked above it."""
    B, V = x.shape
    k = torch.where((top_k <= 0) | (top_k > V), torch.full_like(top_k, V), top_k)
    limited = k < V
    if bool((~limited & (top_p >= 1.0)).any()) or int(torch.where(limited, k, 0).max()) > cap:
        return None
    C = min(V, cap if not bool(limited.all()) else int(k.max()))
    log_z_row = None if bool(limited.all()) else x.logsumexp(dim=-1)  # the whole row's
    if log_z_row is not None and bool(
            (~limited & ((x.amax(dim=-1) - log_z_row).exp() * C < top_p)).any()):
        return None  # C tokens of at most the top one's probability cannot reach p
    w, ids = x.topk(C, dim=-1)  # (B, C) descending
    kth = w.gather(1, (k.clamp(max=C) - 1).long()[:, None])  # the k-th largest (top-k rows)
    if bool(((x >= kth).sum(dim=-1) > C)[limited].any()):
        return None  # ties with the k-th largest run past the candidates
    cols = torch.arange(C, device=x.device)[None]
    w = w.masked_fill(limited[:, None] & (w < kth), NEG_INF)
    # top-p over the top-k set (softmax of the masked row) or over the whole row
    log_z = w.logsumexp(dim=-1)
    if log_z_row is not None:
        log_z = torch.where(limited, log_z, log_z_row)
    probs = (w - log_z[:, None]).exp()
    mass_before = probs.cumsum(dim=-1) - probs
    nucleus = top_p < 1.0
    if bool((nucleus & ~limited & (mass_before[:, -1] + probs[:, -1] < top_p)).any()):
        return None  # the cap largest do not hold the nucleus
    drop = (mass_before >= top_p[:, None]) & nucleus[:, None] & (cols > 0)
    w = w.masked_fill(drop, NEG_INF)
    # min-p: a kept token's probability against the top one's, exp(w - w_max)
    low = (w - w[:, :1]).exp() < min_p[:, None]
    return ids, w.masked_fill(low & (min_p[:, None] > 0), NEG_INF)


def first_argmax(x: torch.Tensor) -> torch.Tensor:
    """The index of each row's first maximum, [B, V] -> [B], as argmax gives it; torch's
    max reduction returns the same index (documented: the first maximal value) and on a
    CPU takes half the time of argmax's, a few percent of a small model's decode step."""
    return x.max(dim=-1).indices


def exponential_race(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Sample rows of probs [B, V] with Exp(1) noise [B, V]: argmax p / E is distributed
    as Categorical(p) (the exponential-race / Gumbel-max trick), so the randomness lives in
    `noise`, which a per-request generator can own."""
    return first_argmax(probs / noise)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[b, tokens[b]] in fp32 -> [B]."""
    return logits.float().log_softmax(dim=-1).gather(1, tokens[:, None].long()).squeeze(1)


def seed_for(seed: int, index: int) -> int:
    """A 63-bit generator seed for draw `index` of a request seeded with `seed`: draws do
    not depend on batch composition or on preemption (which replays a request)."""
    x = (seed * 0x9E3779B97F4A7C15 + index * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB)
    x &= (1 << 64) - 1
    x ^= x >> 31
    return x & ((1 << 63) - 1)
