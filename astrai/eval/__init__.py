"""Evaluation: bits per byte / perplexity on held-out text, and the lm-evaluation-harness
model `astrai` (docs/eval.md).

`Scorer` (prefix-tree batched log-likelihoods), `rolling_windows`, `evaluate_perplexity`,
`run_tasks`. The lm-eval adapter lives in `astrai.eval.harness` (imports lm_eval).
"""

from astrai.eval.perplexity import PerplexityResult, evaluate_perplexity, score_documents
from astrai.eval.score import Scorer
from astrai.eval.tasks import MissingDependencyError, result_rows, run_tasks
from astrai.eval.windows import rolling_windows

__all__ = ["MissingDependencyError", "PerplexityResult", "Scorer", "evaluate_perplexity",
           "result_rows", "rolling_windows", "run_tasks", "score_documents"]
