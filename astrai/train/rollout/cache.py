"""Which rollout each micro-batch trains on (online RL, docs/alignment.md).

The trainer asks a strategy for every micro-batch's loss units before running the window,
so that is where rollouts are made: micro-batch i of the run is slot i % grad_accum_steps of
window i // grad_accum_steps. In a window w with w % rollout_interval == 0 every slot gets a
fresh rollout of its prompt batch; the windows in between train again on the cached
rollouts (their own prompt batches are not used). The cache and the counter are part of
the strategy state, so a resumed run continues on the very same rollouts.
"""

from __future__ import annotations

from typing import Any

import torch

from astrai.train.rollout.runner import RolloutRunner, prompt_lists


class RolloutCache:
    def __init__(self, runner: RolloutRunner, *, rollout_interval: int = 1,
                 grad_accum_steps: int = 1, pad_id: int = 0) -> None:
        self.runner = runner
        self.interval, self.accum, self.pad_id = rollout_interval, grad_accum_steps, pad_id
        self.calls = 0
        """Micro-batches attached so far."""
        self.entries: dict[int, dict[str, Any]] = {}
        """slot -> rollout batch (to_batch tensors, references, metrics, old_logps)."""
        self.rollouts = 0

    def attach(self, batch: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """(the rollout entry this micro-batch trains on, whether it is fresh); the entry's
        tensors are written into `batch` (prompts replaced by the rollout's)."""
        if "_slot" in batch:
            return self.entries[batch["_slot"]], False
        i = self.calls
        self.calls += 1
        window, slot = divmod(i, self.accum)
        fresh = window % self.interval == 0 or slot not in self.entries
        if fresh:
            ro = self.runner.generate(prompt_lists(batch["prompts"], batch["prompt_mask"]),
                                      references=batch.get("reference"), key=i)
            entry: dict[str, Any] = ro.to_batch(self.pad_id)
            entry["rollout_metrics"] = ro.metrics()
            if ro.references is not None:
                entry["reference"] = ro.references
            self.entries[slot] = entry
            self.rollouts += 1
        entry = self.entries[slot]
        batch.update({k: v for k, v in entry.items() if k not in ("old_logps",
                                                                  "rollout_metrics")})
        batch["_slot"] = slot
        return entry, fresh

    # -- validation: greedy answers scored by the reward ---------------------------------------
    @torch.no_grad()
    def evaluate(self, batch: dict[str, Any], max_tokens: int | None = None
                 ) -> dict[str, float]:
        from astrai.train.rewards.rules import normalize

        refs = batch.get("reference")
        ro = self.runner.generate(prompt_lists(batch["prompts"], batch["prompt_mask"]),
                                  references=refs, greedy=True, max_tokens=max_tokens)
        out = {"reward": float(ro.rewards.sum()), "prompts": ro.num_prompts}
        if refs is not None:
            out["exact"] = float(sum(bool(r.strip()) and normalize(t) == normalize(r)
                                     for t, r in zip(ro.texts, refs)))
        return out

    @staticmethod
    def eval_summary(sums: dict[str, float]) -> dict[str, float]:
        n = max(1, int(sums.get("prompts", 0)))
        out = {"val_reward": sums["reward"] / n}
        if "exact" in sums:
            out["val_accuracy"] = sums["exact"] / n
        return out

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        entries = {}
        for slot, e in self.entries.items():
            entries[int(slot)] = {k: v.detach().cpu() if torch.is_tensor(v) else v
                                  for k, v in e.items()}
        return {"calls": self.calls, "rollouts": self.rollouts, "entries": entries}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.calls = int(state.get("calls", 0))
        self.rollouts = int(state.get("rollouts", 0))
        self.entries = {int(k): dict(v) for k, v in state.get("entries", {}).items()}
