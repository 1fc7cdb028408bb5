"""Benchmark tasks through lm-evaluation-harness with the `astrai` model.

`run_tasks` is lm-eval's `simple_evaluate` with astrai's adapter (astrai/eval/harness.py);
`result_rows` flattens its results for a table. lm-eval is an optional dependency
(`pip install 'astrai[eval]'`); without it `require_lm_eval` raises one clear error.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from astrai.errors import AstraiError, ConfigError, DataError

INSTALL = "pip install 'astrai[eval]'"
LOCAL_TASK = "examples/eval/tiny_task"


class MissingDependencyError(AstraiError):
    """An optional dependency a command needs is not installed."""


def require_lm_eval() -> None:
    if importlib.util.find_spec("lm_eval") is None:
        raise MissingDependencyError(
            f"--tasks needs lm-evaluation-harness, which is not installed: {INSTALL}")


def run_tasks(checkpoint: str | Path, tasks: list[str], *, num_fewshot: int | None = None,
              limit: float | None = None, seed: int = 0,
              apply_chat_template: bool = False, include_path: str | Path | None = None,
              device: str = "auto", dtype: str | None = None, batch_tokens: int = 1024,
              max_gen_toks: int = 256, adapter: str | Path | None = None,
              quantize: str | None = None, decode: str = "auto") -> dict[str, Any]:
    """lm-eval's results dict ("results", "versions", "n-shot", "config", ...); `adapter`:
    a PEFT LoRA directory merged into the model (default: a LoRA checkpoint's own)."""
    require_lm_eval()
    import lm_eval
    from lm_eval.tasks import TaskManager

    from astrai.eval.harness import AstraiLM
    from astrai.model.hf import read_config

    read_config(checkpoint)  # a directory that is no checkpoint says so before anything else
    if not tasks:
        raise ConfigError("--tasks: name at least one task (e.g. --tasks hellaswag,arc_easy)")
    manager = TaskManager(include_path=str(include_path) if include_path else None)
    missing = [t for t in tasks if t not in manager.all_tasks]
    if missing:
        raise ConfigError(f"--tasks: unknown task {', '.join(missing)}; `lm_eval ls tasks` "
                          "lists them, --include-path adds a folder of task YAMLs")
    lm = AstraiLM(str(checkpoint), device=device, dtype=dtype, batch_tokens=batch_tokens,
                  max_gen_toks=max_gen_toks, seed=seed, adapter=adapter, quantize=quantize,
                  decode=decode)
    try:
        with _git_hash_from_files():
            return lm_eval.simple_evaluate(
                model=lm, tasks=tasks, num_fewshot=num_fewshot, limit=limit,
                task_manager=manager, apply_chat_template=apply_chat_template,
                random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
                fewshot_random_seed=seed, log_samples=False)
    except _offline_errors() as e:
        raise DataError(f"--tasks {','.join(tasks)}: lm-eval could not fetch a task's dataset "
                        f"from the Hugging Face Hub ({e}); run once with network to fill the "
                        "datasets cache (later runs read it offline), or score a local task: "
                        f"--include-path {LOCAL_TASK} --tasks tiny_task (docs/eval.md, "
                        "\"Offline\")") from None


def _offline_errors() -> tuple[type[BaseException], ...]:
    """What `datasets` / `huggingface_hub` raise for a dataset neither the Hub (offline, or
    in offline mode) nor the cache can give."""
    errors: list[type[BaseException]] = [ConnectionError]
    try:
        from huggingface_hub.errors import LocalEntryNotFoundError

        errors.append(LocalEntryNotFoundError)
    except ImportError:
        pass
    return tuple(errors)


@contextlib.contextmanager
def _git_hash_from_files() -> Iterator[None]:
    """lm-eval records the current directory's git commit by running `git describe`, whose
    `fatal: not a git repository` reaches the terminal outside a repository; read the
    commit from .git's files instead (lm-eval's own fallback), which prints nothing."""
    from lm_eval import evaluator

    try:
        from lm_eval.loggers.utils import get_commit_from_path
    except ImportError:  # another lm-eval layout: leave it be
        yield
        return
    saved = getattr(evaluator, "get_git_commit_hash", None)
    evaluator.get_git_commit_hash = lambda: get_commit_from_path(os.getcwd())
    try:
        yield
    finally:
        if saved is not None:
            evaluator.get_git_commit_hash = saved


def result_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per task and metric: task, metric, value, stderr (None when not computed),
    n-shot."""
    rows = []
    shots = results.get("n-shot", {})
    for task, metrics in results.get("results", {}).items():
        for key, value in metrics.items():
            # metric keys are "metric,filter"; others (alias, sample_len) are bookkeeping
            if "," not in key or "_stderr," in key or not isinstance(value, (int, float)):
                continue
            metric, _, filt = key.partition(",")
            err = metrics.get(f"{metric}_stderr,{filt}")
            rows.append({"task": task, "metric": metric, "filter": filt, "value": value,
                         "stderr": err if isinstance(err, (int, float)) else None,
                         "n_shot": shots.get(task)})
    return rows
