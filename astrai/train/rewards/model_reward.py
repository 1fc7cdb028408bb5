"""`--reward model:DIR`: scores from a reward checkpoint (`astrai train --strategy reward`).

The reward model reads the same token ids the policy saw (prompt + completion), so its
tokenizer must be the policy's (same fingerprint). The score is the head's output at the
completion's last token, exactly where the reward strategy trained it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from astrai.errors import CheckpointError, ConfigError
from astrai.model.reward_head import RewardModel


class ModelReward:
    def __init__(self, path: str | Path, *, device: torch.device | str = "cpu",
                 dtype: torch.dtype | None = None, tokenizer_fingerprint: str | None = None,
                 batch_size: int = 32) -> None:
        from astrai.model.checkpoint import load_checkpoint

        path = Path(path)
        try:
            model, _, _ = load_checkpoint(path, device=device, dtype=dtype)
        except CheckpointError as e:
            raise ConfigError(f"--reward model:{path}: {e}") from None
        if not isinstance(model, RewardModel):
            raise ConfigError(f"--reward model:{path}: not a reward checkpoint (its weights have "
                              "no score_head); train one with `astrai train --strategy reward`")
        if tokenizer_fingerprint is not None and (path / "tokenizer.json").is_file():
            from astrai.data.tokenizer import Tokenizer

            theirs = Tokenizer.load(path).fingerprint()
            if theirs != tokenizer_fingerprint:
                raise ConfigError(f"--reward model:{path}: its tokenizer differs from the "
                                  "policy's; a reward model must read the policy's token ids "
                                  "(train it on data preprocessed with the same tokenizer)")
        self.model = model.eval().requires_grad_(False)
        self.path, self.batch_size = path, batch_size
        self.max_len = model.config.max_seq_len
        self.__name__ = f"model:{path}"

    @torch.no_grad()
    def __call__(self, prompts: Sequence[str], completions: Sequence[str], *,
                 prompt_ids: Sequence[Sequence[int]] | None = None,
                 completion_ids: Sequence[Sequence[int]] | None = None,
                 **record: Any) -> list[float]:
        if prompt_ids is None or completion_ids is None:
            raise ConfigError(f"reward model:{self.path} needs the token ids of prompts and "
                              "completions (record columns prompt_ids, completion_ids)")
        seqs = [(list(p) + list(c))[-self.max_len:] for p, c in zip(prompt_ids, completion_ids)]
        dev = next(self.model.parameters()).device
        out: list[float] = []
        for i in range(0, len(seqs), self.batch_size):
            chunk = seqs[i:i + self.batch_size]
            T = max(len(s) for s in chunk)
            ids = torch.zeros(len(chunk), T, dtype=torch.long)
            for b, s in enumerate(chunk):
                ids[b, :len(s)] = torch.tensor(s, dtype=torch.long)
            last = torch.tensor([len(s) - 1 for s in chunk])
            scores = self.model(ids.to(dev), last_index=last.to(dev)).scores
            out += scores.float().cpu().tolist()
        return out
