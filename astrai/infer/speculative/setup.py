"""An engine's speculator from its SpeculativeConfig: the proposer (n-gram, or a draft model
loaded and checked against the target's tokenizer) and the verifier (docs/engine.md
"Speculative decoding")."""

from __future__ import annotations

from typing import Any

import torch

from astrai.errors import ConfigError
from astrai.infer.config import SpeculativeConfig
from astrai.infer.speculative.speculator import Speculator


def make_speculator(engine: Any, config: SpeculativeConfig | None,
                    draft: torch.nn.Module | None) -> Speculator | None:
    """`engine`'s speculator for `config` (None: no speculative decoding), with `draft` as
    its draft model or one loaded from `config.model`; the draft runs native where the
    engine's decode path is."""
    if config is None:
        if draft is not None:
            raise ConfigError("a draft model without speculative=SpeculativeConfig("
                              "method='draft')")
        return None
    proposer = None
    if config.method == "draft":
        from astrai.infer.loading import load_model
        from astrai.infer.speculative.draft import DraftProposer

        if draft is None and config.model is None:
            raise ConfigError("speculative method 'draft' needs a draft model: "
                              "--speculative-model DIR")
        p = next(engine.model.parameters())
        if draft is None:
            check_draft_tokenizer(engine.tokenizer, config.model)
            draft = load_model(config.model, device=str(p.device), dtype=p.dtype)
        proposer = DraftProposer(draft, engine.cache_config, vocab_size=engine.vocab_size,
                                 max_context=engine.max_context, dtype=p.dtype,
                                 device=p.device, kernels=engine.cpu_kernels,
                                 native=engine.decode_path.name == "native")
    return Speculator(config, engine.sampler, engine.max_context,
                      engine.scheduler_config.max_step_tokens, proposer)


def check_draft_tokenizer(tokenizer: Any, path: str) -> None:
    """A draft must read the target's token ids: equal vocabulary sizes are not enough
    (two tokenizers of one size map text to different ids, and every proposal would be
    rejected). Compared by fingerprint when both directories have a tokenizer."""
    from astrai.infer.loading import load_tokenizer

    ours = getattr(tokenizer, "fingerprint", None)
    theirs = load_tokenizer(path)
    if ours is None or theirs is None or theirs.fingerprint() == ours():
        return
    where = getattr(tokenizer, "path", None) or "the model"
    raise ConfigError(f"--speculative-model {path}: its tokenizer differs from {where}'s "
                      "(same vocabulary size, other tokens or merges); use a draft trained "
                      "with the model's tokenizer")
