"""The newcomer path: `astrai quickstart` (tokenizer -> data -> training -> bits per byte ->
sample -> the next commands), on the Shakespeare corpus bundled in examples/data."""

from astrai.quickstart.config import QuickstartConfig
from astrai.quickstart.corpus import Corpus, find_corpus
from astrai.quickstart.pipeline import (
    STAGES,
    QuickstartResult,
    StageEvent,
    next_commands,
    run_quickstart,
)
from astrai.quickstart.sizing import StepPlan, measure_step_seconds, size_steps

__all__ = [
    "STAGES", "Corpus", "QuickstartConfig", "QuickstartResult", "StageEvent", "StepPlan",
    "find_corpus", "measure_step_seconds", "next_commands", "run_quickstart", "size_steps",
]
