"""Bits per byte and perplexity of a checkpoint on held-out text.

Two inputs:
  * a JSONL file (text records, or chat records rendered through the tokenizer's chat
    template): every document is scored token by token with lm-eval's
    `loglikelihood_rolling` semantics (the first token predicted from BOS / EOT, longer
    documents in rolling windows of the model's context; astrai/eval/windows.py), and
    bits per byte is lm-eval's `bits_per_byte`: -Σ log p / (ln 2 · UTF-8 bytes of the text);
  * a dataset directory of `astrai preprocess`: the validation the trainer runs
    (astrai/train/evaluate.py's sums through the strategy's `evaluate_batch`) on the
    dataset's `val` split (its main split when it has none), so the numbers are the
    `val_bpb` / `val_ppl` a training run reports for the same data and checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from astrai.errors import CheckpointError, DataError


@dataclass
class PerplexityResult:
    """Sums and the metrics they give."""

    source: str
    documents: int
    """Documents (JSONL) or rows (dataset directory) scored."""
    tokens: int
    """Tokens predicted."""
    bytes: int
    """UTF-8 bytes those tokens stand for."""
    nll: float
    """Summed negative log-likelihood, nats."""

    @property
    def bpb(self) -> float:
        """Bits per UTF-8 byte."""
        return self.nll / math.log(2) / max(1, self.bytes)

    @property
    def ppl(self) -> float:
        """Token perplexity exp(nll / tokens) (as training's val_ppl: capped at e^80)."""
        return math.exp(min(self.nll / max(1, self.tokens), 80.0))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "bpb": self.bpb, "ppl": self.ppl}


def document_text(rec: dict, field: str, tokenizer: Any, where: str) -> str:
    """The text of one record: `field` as a string, or a chat (`messages` list) rendered
    through the chat template."""
    from astrai.data.records import record_text

    value = rec.get(field)
    if value is None and "messages" in rec:
        value = rec["messages"]
    if isinstance(value, list):
        if not all(isinstance(m, dict) and "role" in m for m in value):
            raise DataError(f"{where}: '{field}' is a list but not of {{role, content}} "
                            "messages")
        return tokenizer.render_chat(value, add_generation_prompt=False)
    return record_text(rec, field, where)


def read_documents(path: Path, field: str, tokenizer: Any,
                   limit: int | None = None) -> list[str]:
    from astrai.data.records import iter_lines, parse_record

    docs = []
    for n, line in iter_lines(path):
        docs.append(document_text(parse_record(line, f"{path}:{n}"), field, tokenizer,
                                  f"{path}:{n}"))
        if limit is not None and len(docs) >= limit:
            break
    if not docs:
        raise DataError(f"{path}: no records; write one JSON object per line")
    return docs


def score_documents(model: torch.nn.Module, tokenizer: Any, docs: list[str], *,
                    max_len: int | None = None, batch_tokens: int = 1024,
                    source: str = "<memory>") -> PerplexityResult:
    """Rolling log-likelihood of each document (lm-eval `loglikelihood_rolling`)."""
    from astrai.eval.score import Scorer

    prefix = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.eos_id
    if prefix is None:
        raise CheckpointError("the tokenizer has neither BOS nor EOS: the first token of a "
                              "document needs one to be predicted from")
    ids = [tokenizer.encode(d) for d in docs]
    lls = Scorer(model, max_len, batch_tokens).rolling(ids, prefix)
    return PerplexityResult(source, len(docs), sum(len(i) for i in ids),
                            sum(len(d.encode("utf-8")) for d in docs), -sum(lls))


def score_dataset(model: torch.nn.Module, path: Path, *, batch_size: int = 8,
                  limit: int | None = None) -> PerplexityResult:
    """Training's validation on a preprocessed dataset directory."""
    from torch.utils.data import DataLoader, Subset

    from astrai.data.bpb import token_byte_lengths
    from astrai.train.data import open_train_data
    from astrai.train.strategies import STRATEGIES

    data = open_train_data(str(path))
    if data.kind not in ("pretrain", "sft"):
        raise DataError(f"{path} is a {data.kind} dataset: bits per byte needs a pretrain or "
                        "sft dataset")
    rows = data.eval_dataset if data.eval_dataset is not None else data.dataset
    if limit is not None:
        rows = Subset(rows, range(min(limit, len(rows))))
    strategy = STRATEGIES.get("seq" if data.kind == "pretrain" else "sft")(
        model, device=next(model.parameters()).device)
    lengths = token_byte_lengths(data.tokenizer_dir) if data.tokenizer_dir else None
    sums: dict[str, float] = {}
    model.eval()
    with torch.no_grad():
        for batch in DataLoader(rows, batch_size=batch_size, shuffle=False,
                                collate_fn=data.collate_fn):
            for k, v in strategy.evaluate_batch(strategy.to_device(batch), lengths).items():
                sums[k] = sums.get(k, 0) + v
    return PerplexityResult(str(path), len(rows), int(sums.get("tokens", 0)),
                            int(sums.get("bytes", 0)), float(sums.get("nll", 0.0)))


def evaluate_perplexity(checkpoint: str | Path, data: str | Path, *, field: str = "text",
                        device: str = "auto", dtype: str | None = None,
                        max_len: int | None = None, batch_tokens: int = 1024,
                        batch_size: int = 8, limit: int | None = None,
                        adapter: str | Path | None = None,
                        quantize: str | None = None) -> PerplexityResult:
    """Bits per byte and perplexity of `checkpoint` on a JSONL file or a dataset directory;
    `adapter`: a PEFT LoRA directory merged in (default: a LoRA checkpoint's own);
    `quantize`: 'int8' weights (`load_model`)."""
    from astrai.infer.loading import load_model, load_tokenizer
    from astrai.model.hf import read_config

    read_config(checkpoint)  # a directory that is no checkpoint says so before anything else
    data = Path(data)
    if not data.exists():
        raise DataError(f"--data {data}: no such file or directory")
    if data.is_dir():
        if not (data / "manifest.json").is_file():
            raise DataError(f"--data {data}: a directory must be a dataset written by "
                            "`astrai preprocess` (manifest.json); or pass a .jsonl file")
        return score_dataset(load_model(checkpoint, device=device, dtype=dtype,
                                        adapter=adapter, quantize=quantize), data,
                             batch_size=batch_size, limit=limit)
    tok = load_tokenizer(checkpoint)
    if tok is None:
        raise CheckpointError(f"{checkpoint} has no tokenizer.json: scoring text needs the "
                              "tokenizer the model was trained with; copy it in")
    docs = read_documents(data, field, tok, limit)
    model = load_model(checkpoint, device=device, dtype=dtype, adapter=adapter,
                       quantize=quantize)
    return score_documents(model, tok, docs, max_len=max_len, batch_tokens=batch_tokens,
                           source=str(data))
