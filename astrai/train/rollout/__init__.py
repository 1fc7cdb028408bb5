"""Online rollouts: generate grouped responses with the inference engine and score them."""

from astrai.config.alignment import RolloutOptions
from astrai.train.rollout.batch import Rollout
from astrai.train.rollout.runner import RolloutRunner, prompt_lists, request_seed

__all__ = ["Rollout", "RolloutOptions", "RolloutRunner", "prompt_lists", "request_seed"]
