"""Strategy registry: `STRATEGIES.get(name)(model, device=..., **options)`.

Add a strategy with one line in STRATEGIES: "name": "module.path:Class" (imported only
when chosen), a subclass of `Strategy`.
"""

from __future__ import annotations

from astrai.train.registry import Registry
from astrai.train.strategies.base import LossOutput, Strategy, StrategyInputs
from astrai.train.strategies.seq import SeqStrategy
from astrai.train.strategies.sft import SFTStrategy

STRATEGIES: Registry[Strategy] = Registry("strategy", {
    "seq": SeqStrategy,
    "sft": SFTStrategy,
    "dpo": "astrai.train.strategies.dpo:DPOStrategy",
    "grpo": "astrai.train.strategies.grpo:GRPOStrategy",
    "reward": "astrai.train.strategies.reward:RewardStrategy",
    "online-grpo": "astrai.train.strategies.online:OnlineGRPOStrategy",
    "online-dpo": "astrai.train.strategies.online:OnlineDPOStrategy",
})


__all__ = ["STRATEGIES", "LossOutput", "SFTStrategy", "SeqStrategy", "Strategy", "StrategyInputs"]
