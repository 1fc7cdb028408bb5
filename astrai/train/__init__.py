"""Training: trainer loop, callbacks, strategies, schedulers, executors, checkpoints.

Entry points: `train(config)`, `resume(run_dir)`, `plan_run(config)` (astrai.train.run).
"""

from astrai.config.train import TrainConfig, load_train_config
from astrai.train.callbacks import Callback, default_callbacks
from astrai.train.context import TrainContext, TrainerState
from astrai.train.executors import EXECUTORS, Executor, NoneExecutor
from astrai.train.report import MicroBatch, StepControl, StepReport
from astrai.train.run import TrainSummary, plan_run, resume, train
from astrai.train.strategies import STRATEGIES, Strategy
from astrai.train.trainer import NonFiniteError, Trainer

__all__ = [
    "EXECUTORS", "STRATEGIES", "Callback", "Executor", "MicroBatch", "NonFiniteError",
    "NoneExecutor", "StepControl", "StepReport", "Strategy", "TrainConfig", "TrainContext", "TrainSummary",
    "Trainer", "TrainerState", "default_callbacks", "load_train_config", "plan_run", "resume",
    "train",
]
