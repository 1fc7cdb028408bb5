"""Online rollouts: generate grouped responses with the inference engine and score them."""

from astrai.train.rollout.batch import Rollout
from astrai.train.rollout.runner import RolloutConfig, RolloutRunner, prompt_lists, request_seed

__all__ = ["Rollout", "RolloutConfig", "RolloutRunner", "prompt_lists", "request_seed"]
