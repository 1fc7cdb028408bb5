"""The quickstart's run plan as a pure function of what was measured: `plan(config, m)`.

Given the seconds one step of the recipe's model takes (and, when asked for, the smaller
fallback model's), the seconds already spent and the shape of the data, `plan` decides how
many steps to train, which model, and what to tell the user about it. Nothing here trains
or times anything, so every branch is tested with made-up measurements
(tests/cli/test_quickstart.py); the pipeline measures, calls `plan`, and measures the
fallback model only when the first plan asks for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from astrai.quickstart.config import QuickstartConfig
from astrai.quickstart.sizing import StepPlan, eval_seconds, size_steps

TAIL_S = 6.0
"""Seconds kept for what follows validation (checkpoint, engine start, the sample)."""


@dataclass(frozen=True)
class Measurements:
    """What the pipeline knows when it sizes the run."""

    elapsed_s: float
    """Seconds since the quickstart began (tokenizer and preprocessing)."""
    threads: int
    """CPU threads the run will use."""
    steps_per_epoch: int
    val_tokens: int
    tokens_per_step: int
    recipe_step_s: float | None = None
    """Seconds per step of the recipe's model (None with `steps`: nothing was timed)."""
    fallback_step_s: float | None = None
    """Seconds per step of the fallback model, once measured."""


@dataclass(frozen=True)
class Plan:
    """The run to train."""

    steps: StepPlan
    """The trained model's steps (the fallback's when `fallback_from` is set)."""
    recipe: StepPlan
    """What the budget gave the recipe's model."""
    overrides: dict[str, Any]
    """ModelConfig changes on the preset (the fallback's on top of the recipe's)."""
    fallback_from: int | None
    """The recipe's steps when too few, so the fallback model trains instead."""
    wants_fallback: bool
    """The fallback model should be timed: plan again with `fallback_step_s`."""
    full_budget_s: float | None
    """The --time-budget that would fit the whole recipe, when the budget cut much of it."""
    info: str
    """One line for the user: steps, speed, and why."""


def _size(config: QuickstartConfig, m: Measurements, step_s: float) -> StepPlan:
    left = (config.time_budget_s - m.elapsed_s
            - eval_seconds(step_s, m.val_tokens, m.tokens_per_step) - TAIL_S)
    return size_steps(left, step_s, steps_per_epoch=m.steps_per_epoch,
                      max_epochs=config.max_epochs, threads=m.threads)


def plan(config: QuickstartConfig, m: Measurements, base: dict[str, Any]) -> Plan:
    """The run for `config` given `m`; `base`: the recipe's ModelConfig overrides."""
    if config.steps is not None or m.recipe_step_s is None:
        fixed = StepPlan(config.steps or 1, None, m.threads, None, None)
        return Plan(fixed, fixed, base, None, False, None, _info(fixed, None))
    recipe = _size(config, m, m.recipe_step_s)
    chosen, overrides, fallback_from = recipe, base, None
    slow = (config.fallback_overrides is not None and recipe.budget_cut
            and recipe.steps < config.fallback_below_steps)
    if slow and m.fallback_step_s is not None:
        chosen = _size(config, m, m.fallback_step_s)
        overrides, fallback_from = {**base, **config.fallback_overrides}, recipe.steps
    full_budget_s = None
    if recipe.cut_short and recipe.step_s is not None:
        extra = (recipe.full_steps - recipe.steps) * recipe.step_s
        full_budget_s = float(math.ceil((config.time_budget_s + extra) / 10) * 10)
    wants = slow and m.fallback_step_s is None
    return Plan(chosen, recipe, overrides, fallback_from, wants, full_budget_s,
                _info(chosen, fallback_from, config.max_epochs))


def _info(p: StepPlan, fallback_from: int | None, max_epochs: float = 0) -> str:
    why = {"epochs": f" (capped at {max_epochs:g} epochs)",
           "minimum": " (the minimum: the budget is too short for this machine)"}
    if p.budget_cut and p.capped_by is None:
        why[""] = f" (cut by the time budget: the recipe is {p.full_steps} steps)"
    speed = "" if p.step_s is None else \
        f" at {p.step_s:.2f} s/step, {p.threads} thread{'s' * (p.threads > 1)}"
    model = "" if fallback_from is None else (
        f" of the smaller fallback model (the recipe's would get {fallback_from})")
    return f"{p.steps} steps{model}{speed}{why.get(p.capped_by or '', '')}"
