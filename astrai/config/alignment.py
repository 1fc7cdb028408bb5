"""Options of the preference and RL strategies (dpo, grpo, reward, online-grpo, online-dpo).

`TrainConfig.alignment` holds these fields, and `alignment.rollout` how online runs sample
(the rollout runner takes that section as its config). Their flat names are the field names
(`--beta`, config key `beta` or `alignment: {beta: ...}`), the rollout's with `rollout_`
(`--rollout-max-tokens` is `alignment.rollout.max_tokens`). Defaults
(docs/alignment.md): beta 0.1 with reduction "sum" (the DPO paper's sequence log-prob),
group_size 4, clip_eps 0.2, kl_coef 0.01; the GRPO advantage and aggregation options
follow TRL's GRPOConfig (scale_rewards "group", loss_type "dapo").
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from astrai.config.section import Section

DPOLossType = Literal["sigmoid", "ipo", "hinge"]
GROUP_SIZE = 4
"""Responses sampled per prompt by default (online-grpo / online-dpo, the rollout runner)."""


class RolloutOptions(Section):
    """How the rollouts of online-* runs are sampled (the inference engine's settings)."""

    flag_prefix: ClassVar[str] = "rollout_"
    panel: ClassVar[str] = "Rollouts (online-*)"

    interval: int = Field(1, gt=0)
    """Optimizer steps each rollout is trained on; a fresh rollout (and an old_model sync)
    every N steps. Prompt batches drawn between refreshes are not used."""
    max_tokens: int = Field(64, gt=0)
    """Most tokens generated per response."""
    temperature: float = Field(1.0, ge=0)
    """Sampling temperature of the rollouts (0 = greedy, which gives identical groups)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling of the rollouts."""
    top_k: int = Field(0, ge=0)
    """Top-k sampling of the rollouts (0 = off)."""
    max_requests: int | None = Field(None, gt=0)
    """Requests the inference engine decodes at once; None = every response of a batch."""


class AlignmentOptions(Section):
    """The dpo / grpo / reward / online-* options of TrainConfig."""

    panel: ClassVar[str] = "Alignment (dpo/grpo/online)"

    # -- reference policy (dpo, grpo KL, online-*) ------------------------------------------
    ref_model: str | None = None
    """Frozen reference checkpoint (astrai or HF directory); None = the initial policy
    (--model), rebuilt the same way on resume."""
    precompute_ref: bool = False
    """dpo: compute the reference log-probs of every pair once before training, keep them
    in the run's state, and free the reference model."""

    # -- DPO ---------------------------------------------------------------------------------
    beta: float = Field(0.1, gt=0)
    """DPO temperature beta (implicit reward = beta * log pi/pi_ref)."""
    dpo_loss: DPOLossType = "sigmoid"
    """sigmoid (DPO, Rafailov et al. 2023), ipo (Azar et al. 2023), hinge (SLiC, Zhao et
    al. 2023)."""
    dpo_reduction: Literal["sum", "mean"] | None = None
    """How a response's token log-probs combine: sum or mean (length-normalised); None =
    mean for ipo (as the IPO paper's results and TRL), sum for sigmoid and hinge (as TRL)."""

    # -- GRPO --------------------------------------------------------------------------------
    group_size: int = Field(GROUP_SIZE, ge=2)
    """online-grpo / online-dpo: responses generated per prompt (offline grpo uses the
    dataset's groups)."""
    clip_eps: float = Field(0.2, gt=0, lt=1)
    """GRPO: the ratio pi/pi_old is clipped to [1 - clip_eps, 1 + clip_eps]."""
    kl_coef: float = Field(0.01, ge=0)
    """GRPO: weight of the KL(pi || pi_ref) estimator; 0 = no reference model is loaded."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """GRPO advantages: (r - group mean) divided by the group's sample std (group), the
    batch's (batch), or not divided (none, Dr. GRPO); TRL's scale_rewards."""
    grpo_loss_type: Literal["dapo", "grpo", "dr_grpo", "bnpo"] = "dapo"
    """GRPO token-loss aggregation (TRL's loss_type): dapo = sum / tokens of the window,
    grpo = mean per response then over responses, dr_grpo = sum / (responses x max
    completion length), bnpo = mean over each micro-batch's tokens."""
    sync_interval: int = Field(1, gt=0)
    """grpo (offline): optimizer steps between syncs of old_model (the behaviour policy of
    the ratio) with the policy; 1 = every step (the ratio is then exactly 1)."""

    # -- rewards (online-*) -------------------------------------------------------------------
    reward: list[str] = Field(default_factory=list)
    """Reward functions, summed: exact, numeric, regex:PATTERN, length:MAX_TOKENS,
    model:REWARD_CHECKPOINT, or module:function / file.py:function (a user callable
    (prompts, completions, **record) -> list[float]). Default for online runs: exact."""
    reward_weights: list[float] | None = None
    """One weight per --reward (default 1 each)."""

    # -- rollouts (online-*) ------------------------------------------------------------------
    rollout: RolloutOptions = Field(default_factory=RolloutOptions)
    """How online runs sample their rollouts (the --rollout-* options)."""
    eval_max_tokens: int | None = Field(None, gt=0)
    """online-*: most tokens of the greedy answers scored on validation; None = rollout's."""

    @property
    def dpo_reduction_value(self) -> str:
        """The reduction in effect: dpo_reduction, or its default for dpo_loss."""
        if self.dpo_reduction is not None:
            return self.dpo_reduction
        return "mean" if self.dpo_loss == "ipo" else "sum"

    @model_validator(mode="after")
    def _check_rewards(self) -> AlignmentOptions:
        w = self.reward_weights
        if w is not None and len(w) != len(self.reward):
            raise ValueError(f"reward_weights has {len(w)} values for {len(self.reward)} "
                             "--reward functions; give one weight per reward")
        return self
