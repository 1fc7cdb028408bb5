"""Log-likelihoods of continuations, batched as a prefix tree in one forward pass.

`Scorer.loglikelihood(pairs)` returns, for each (context ids, continuation ids), the summed
log-probability of the continuation after the context and whether greedy decoding would have
produced it — lm-evaluation-harness's `loglikelihood` contract, with its truncation: the
model reads the last `max_len` tokens of context + continuation minus the final token.

Batching: the inputs of a batch are merged into a token trie, and the trie's nodes (in
depth-first order) are packed into one row. A node attends to itself and its ancestors — the
prefix it was computed with — and sits at the position of its depth, so every sequence sees
exactly what a forward of it alone would. Inputs sharing a prefix (the choices of a
multiple-choice question, a few-shot preamble shared by many questions) compute that prefix
once, the saving a radix (prefix) KV cache gives, within one forward. Only the scored rows go
through the LM head.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from astrai.eval.windows import rolling_windows
from astrai.model.context import ForwardContext


class TreeMaskBackend:
    """Attention over a packed prefix tree: query i may read key j when j is i's ancestor
    (or i itself), within the model's sliding window."""

    name = "tree"

    def __init__(self, mask: torch.Tensor) -> None:
        self.mask = mask  # (1, 1, N, N) bool

    def attend(self, q, k, v, layer, ctx):
        mask = self.mask
        if ctx.sliding_window is not None:
            pos = ctx.positions[0]
            mask = mask & ((pos[:, None] - pos[None, :]) < ctx.sliding_window)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (1, H|K, N, D)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                             enable_gqa=q.shape[1] != k.shape[1])
        return out.transpose(1, 2)  # (1, N, H, D)


@dataclass
class PackedTree:
    """Sequences merged into a trie, flattened depth-first."""

    tokens: list[int]
    depth: list[int]
    """Position of each node (its depth in the trie, from 0)."""
    end: list[int]
    """One past the last node of each node's subtree (preorder numbering)."""
    paths: list[list[int]]
    """Per sequence, the node index of each of its tokens."""

    def mask(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """[1, 1, N, N] bool: node i reads node j iff j <= i < end[j] (j is an ancestor)."""
        n = len(self.tokens)
        i = torch.arange(n, device=device)
        end = torch.tensor(self.end, device=device)
        return ((i[None, :] <= i[:, None]) & (i[:, None] < end[None, :]))[None, None]


def pack_tree(seqs: Sequence[Sequence[int]]) -> PackedTree:
    """Merge sequences into a trie and number its nodes depth-first."""
    root: dict = {}
    for s in seqs:
        node = root
        for t in s:
            node = node.setdefault(t, {})
    tokens, depth, end, index = [], [], [], {}
    # iterative preorder; index maps id(node dict) -> its number
    stack = [(child, tok, 0, False) for tok, child in reversed(root.items())]
    while stack:
        node, tok, d, closing = stack.pop()
        if closing:
            end[index[id(node)]] = len(tokens)
            continue
        index[id(node)] = len(tokens)
        tokens.append(tok)
        depth.append(d)
        end.append(-1)
        stack.append((node, tok, d, True))
        stack.extend((c, t, d + 1, False) for t, c in reversed(node.items()))
    paths = []
    for s in seqs:
        node, path = root, []
        for t in s:
            node = node[t]
            path.append(index[id(node)])
        paths.append(path)
    return PackedTree(tokens, depth, end, paths)


def model_inputs(context: Sequence[int], continuation: Sequence[int],
                 max_len: int) -> tuple[list[int], int]:
    """(tokens the model reads, how many of its last positions predict the continuation):
    lm-eval's HFLM truncation, (context + continuation)[-(max_len + 1):][:-1]."""
    full = (list(context) + list(continuation))[-(max_len + 1):]
    return full[:-1], min(len(continuation), len(full) - 1)


class Scorer:
    """Batched continuation log-likelihoods under a model (no cache, no sampling)."""

    def __init__(self, model: torch.nn.Module, max_len: int | None = None,
                 batch_tokens: int = 1024) -> None:
        """`max_len`: tokens the model reads at most (default: its max_seq_len).
        `batch_tokens`: trie nodes per forward (memory grows with its square: the mask)."""
        self.model = model.eval()
        self.max_len = max_len or model.config.max_seq_len
        self.batch_tokens = batch_tokens
        self.device = next(model.parameters()).device

    def loglikelihood(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]
                      ) -> list[tuple[float, bool]]:
        """(sum of log p(continuation | context), continuation is the greedy one) per pair."""
        prepared = [model_inputs(c, x, self.max_len) + (list(x),) for c, x in pairs]
        for c, x in pairs:
            if not x:
                raise ValueError("an empty continuation has no log-likelihood")
            if not c:
                raise ValueError("the context must hold at least one token (a BOS / EOT)")
        # Sorting the inputs puts shared prefixes side by side, so batches share most.
        order = sorted(range(len(pairs)), key=lambda i: prepared[i][0])
        out: list[tuple[float, bool] | None] = [None] * len(pairs)
        for batch in self._batches(order, prepared):
            for i, res in zip(batch, self._score([prepared[i] for i in batch])):
                out[i] = res
        return out  # type: ignore[return-value]

    def rolling(self, docs: Sequence[Sequence[int]], prefix_token: int) -> list[float]:
        """Total log-likelihood of each document, predicted token by token from
        `prefix_token` through rolling windows of the context (lm-eval's
        `loglikelihood_rolling`); all windows of all documents are batched together."""
        pairs, owner = [], []
        for d, doc in enumerate(docs):
            for w in rolling_windows(doc, prefix_token, self.max_len):
                pairs.append(w)
                owner.append(d)
        totals = [0.0] * len(docs)
        for d, (lp, _) in zip(owner, self.loglikelihood(pairs)):
            totals[d] += lp
        return totals

    def _batches(self, order: list[int], prepared: list) -> list[list[int]]:
        batches, cur, root, size = [], [], {}, 0
        for i in order:
            inp = prepared[i][0]
            new = self._added(root, inp)  # nodes this input adds to the batch's trie
            if cur and size + new > self.batch_tokens:
                batches.append(cur)
                cur, root, size = [], {}, 0
                new = self._added(root, inp)
            self._insert(root, inp)
            cur.append(i)
            size += new
        if cur:
            batches.append(cur)
        return batches

    @staticmethod
    def _added(root: dict, seq: list[int]) -> int:
        node = root
        for n, t in enumerate(seq):
            if t not in node:
                return len(seq) - n
            node = node[t]
        return 0

    @staticmethod
    def _insert(root: dict, seq: list[int]) -> None:
        node = root
        for t in seq:
            node = node.setdefault(t, {})

    @torch.inference_mode()
    def _score(self, items: list[tuple[list[int], int, list[int]]]) -> list[tuple[float, bool]]:
        tree = pack_tree([inp for inp, _, _ in items])
        dev = self.device
        ids = torch.tensor(tree.tokens, dtype=torch.long, device=dev)[None]  # (1, N)
        pos = torch.tensor(tree.depth, dtype=torch.long, device=dev)[None]  # (1, N)
        ctx = ForwardContext(positions=pos, backend=TreeMaskBackend(tree.mask(dev)))
        h = self.model(ids, ctx, return_hidden=True, compute_logits=False).hidden[0]  # (N, C)
        rows, targets = [], []
        for (inp, n, cont), path in zip(items, tree.paths):
            rows.extend(path[len(inp) - n:])
            targets.extend(cont[len(cont) - n:])
        rows_t = torch.tensor(rows, dtype=torch.long, device=dev)
        logp = self._head(h[rows_t]).float().log_softmax(-1)  # (R, V)
        tgt = torch.tensor(targets, dtype=torch.long, device=dev)
        picked = logp.gather(1, tgt[:, None])[:, 0].tolist()
        greedy = (logp.argmax(-1) == tgt).tolist()
        out, at = [], 0
        for _, n, _ in items:
            out.append((float(sum(picked[at:at + n])), all(greedy[at:at + n])))
            at += n
        return out

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        lm = getattr(self.model, "lm_head", None)
        if lm is not None:
            return lm(h)
        return F.linear(h, self.model.output_weight())
