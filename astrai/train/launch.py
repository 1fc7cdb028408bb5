"""Running a training job on one or many processes.

    launch_train(config)      -> TrainSummary   (`astrai train`)
    launch_resume(run_dir)    -> TrainSummary   (`astrai resume`)

Three ways a run starts (docs/distributed.md):

* One process (nnodes x nprocs == 1): training runs in this process.
* `--nprocs N [--nnodes M --rdzv-endpoint HOST:PORT]`: this process becomes torch's
  elastic agent (torch.distributed.launcher.elastic_launch, what `torchrun` runs, but
  in-process): it validates the run first, then starts N spawned workers on this node,
  which rendezvous with the other nodes' workers, and it watches them.
* Under an external `torchrun` (WORLD_SIZE is set): every worker runs the command itself,
  in place; no second launcher is started.

Only rank 0 writes the run directory, checkpoints, metrics and progress. A worker's user
error (AstraiError) comes back to this process as the same one-line error; a crashed
worker makes the agent stop the others and raises WorkerFailed. A SIGTERM/SIGINT to this
process is forwarded by the agent to the workers, which save at the next step boundary
(astrai.train.preemption); they get `shutdown_timeout_s` for that before being killed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import astrai.errors
from astrai.atomic import write_json_atomic
from astrai.config.train import TrainConfig
from astrai.errors import AstraiError, ConfigError
from astrai.train.executors.process_group import dist_env
from astrai.train.preemption import EXIT_PREEMPTED


class WorkerFailed(AstraiError):
    """A worker process crashed (not a user error); the agent stopped the others."""

    exit_code = 1


class Interrupted(AstraiError):
    """A signal ended a launched run before its workers reported back."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class LaunchOptions:
    """How this node joins a multi-process run (not saved with the run: per invocation)."""

    rdzv_endpoint: str | None = None
    """HOST:PORT of the rendezvous, the same on every node; None = this host, free port
    (single node). With the c10d backend, the node that can bind it hosts the store."""
    rdzv_id: str | None = None
    """Job id shared by all nodes; None = derived from the run directory."""
    rdzv_backend: str = "c10d"
    """torch elastic rendezvous backend (c10d needs no extra service)."""
    node_rank: int | None = None
    """This node's index (0..nnodes-1); with c10d, node 0 hosts the rendezvous store and
    the others connect to it. None = the node whose address matches the endpoint hosts."""
    max_restarts: int = 0
    """Times the agent restarts all workers after a failure; a restarted `train` continues
    from the run's newest complete checkpoint (as `astrai resume`), or starts again when
    there is none yet."""
    shutdown_timeout_s: int = 600
    """After SIGTERM/SIGINT, seconds the workers get to reach a step boundary and save
    their checkpoint before the agent kills them."""
    log_dir: str | None = None
    """Where the agent keeps per-worker error files; None = a temporary directory."""


def world_size(config: TrainConfig) -> int:
    return config.runtime.nnodes * config.runtime.nprocs


def needs_launch(config: TrainConfig) -> bool:
    return world_size(config) > 1 and not dist_env().launched


# -- entry points ------------------------------------------------------------------------
def launch_train(config: TrainConfig, *, launch: LaunchOptions | None = None,
                 progress: bool = False, console: Any = None):
    """Train a new run on nnodes x nprocs processes (or in this one)."""
    from astrai.train import run
    from astrai.train.run_dir import probe_new_run_dir

    if not needs_launch(config):
        with _external_group():
            return run.train(config, progress=progress, console=console)
    config.require("out")
    probe_new_run_dir(run.run_paths(config))  # the workers' rank 0 takes the lock
    run.plan_run(config)  # every user error surfaces here, before any process starts
    return _launch("train", config.model_dump(mode="json"), config, launch or LaunchOptions(),
                   progress)


def launch_resume(run_dir: str | Path, *, reward: list[str] | None = None,
                  launch: LaunchOptions | None = None, progress: bool = False,
                  console: Any = None, tensorboard: bool = False,
                  layout: dict[str, Any] | None = None):
    """Continue a run with the process layout it was started with, or `layout`
    (astrai.train.run.relayout: parallel, nprocs, nnodes, batch_size, grad_accum_steps,
    keeping the global batch). `reward`: the run's --reward specs, required again when
    they are Python code (astrai.train.rewards.trust); `tensorboard`: turn TensorBoard
    event files on from here."""
    from astrai.train import run
    from astrai.train.run_lock import probe_run

    if Path(run_dir).is_dir():
        probe_run(run_dir)  # a live run holds it: say so before reading its checkpoints
    config, _ = run.find_resume_point(run_dir, reward, layout)
    if not needs_launch(config):
        with _external_group():
            return run.resume(run_dir, reward=reward, progress=progress, console=console,
                              tensorboard=tensorboard, layout=layout)
    return _launch("resume", {"run_dir": str(run_dir), "reward": reward,
                              "tensorboard": tensorboard, "layout": layout}, config,
                   launch or LaunchOptions(), progress)


@contextlib.contextmanager
def _external_group():
    """Under an external torchrun, leave the process group destroyed when the run ends
    (the executor joined it; nobody else will tear it down before the process exits)."""
    try:
        yield
    finally:
        if dist_env().launched:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


# -- the launcher ------------------------------------------------------------------------
def run_workers(fn: Callable[..., Any], args: tuple, *, nprocs: int, nnodes: int = 1,
                launch: LaunchOptions | None = None, run_id: str | None = None
                ) -> dict[int, Any]:
    """Run fn(*args) on nprocs spawned processes of this node (torch's elastic agent,
    in-process); {global rank: return value}. fn must be importable (module level)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    opts = launch or LaunchOptions()
    check_launch(opts, nnodes)
    # c10d: which agent hosts the store; rank assignment stays the rendezvous's
    rdzv = {} if opts.node_rank is None else {"is_host": opts.node_rank == 0}
    cfg = LaunchConfig(
        min_nodes=nnodes, max_nodes=nnodes, nproc_per_node=nprocs,
        rdzv_backend=opts.rdzv_backend, rdzv_endpoint=opts.rdzv_endpoint or "localhost:0",
        rdzv_configs=rdzv,
        run_id=opts.rdzv_id or run_id or uuid.uuid4().hex, max_restarts=opts.max_restarts,
        monitor_interval=0.1, start_method="spawn", shutdown_timeout=opts.shutdown_timeout_s,
        logs_specs=DefaultLogsSpecs(log_dir=opts.log_dir),
    )
    with _restartable(opts.max_restarts), _handlers_restored():
        return elastic_launch(cfg, _entry)(fn, args)


# The signals torch's elastic agent takes over (its TORCHELASTIC_SIGNALS_TO_HANDLE default).
AGENT_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
                      if hasattr(signal, n))


@contextlib.contextmanager
def _handlers_restored():
    """torch's elastic agent installs handlers for AGENT_SIGNALS that raise SignalException
    (how _launch hears of a stop) and leaves them installed when it returns. A process that
    goes on (the Python API, a test suite) would keep them, and the processes it forks later
    inherit them: a forked worker told to stop with SIGTERM then raises instead of dying, and
    multiprocessing's Pool.terminate waits on it forever. The launch's caller gets back the
    handlers it had."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.getsignal(sig) for sig in AGENT_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in before.items():
            if handler is not None:  # None: set outside Python, cannot be put back
                signal.signal(sig, handler)


@contextlib.contextmanager
def _restartable(max_restarts: int):
    """With restarts, each round of workers gets a fresh TCP store hosted by its rank 0
    instead of the agents' shared rendezvous store, whose keys from the failed round
    (gloo's and NCCL's peer addresses) a restarted worker may read and then connect to a
    dead peer (PyTorch's issue "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=0 is not compatible
    with torchelastic restarts"; torch's agent reads this variable)."""
    key = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
    if max_restarts == 0 or key in os.environ:
        yield
        return
    os.environ[key] = "1"
    try:
        yield
    finally:
        os.environ.pop(key, None)


def check_launch(opts: LaunchOptions, nnodes: int) -> None:
    """One-line errors for launcher options that cannot form the job."""
    if nnodes > 1 and not opts.rdzv_endpoint:
        raise ConfigError(f"nnodes: {nnodes} nodes need --rdzv-endpoint HOST:PORT, the same on "
                          "every node (one of the nodes' address)")
    if opts.node_rank is not None and not 0 <= opts.node_rank < nnodes:
        raise ConfigError(f"node_rank: {opts.node_rank} is not a node of the {nnodes}-node "
                          f"job; give 0 to {nnodes - 1}, a different one on each node")
    if opts.max_restarts < 0:
        raise ConfigError(f"max_restarts: {opts.max_restarts} is negative; give 0 (no "
                          "restart) or more")


def _entry(fn: Callable[..., Any], args: tuple) -> Any:
    """Worker side of run_workers: die with the agent, share this node's cores, run fn."""
    import torch

    _die_with_parent()

    if "OMP_NUM_THREADS" not in os.environ:
        # torchrun sets OMP_NUM_THREADS=1 for the same reason: N workers with one thread
        # pool of all cores each oversubscribe the machine, and spinning OpenMP threads
        # then slow even tiny matmuls by orders of magnitude.
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local)))
    return fn(*args)


def _launch(action: str, target: Any, config: TrainConfig, opts: LaunchOptions,
            progress: bool):
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from astrai.train.run import TrainSummary

    run_id = "astrai-" + hashlib.sha1(str(Path(config.out).resolve()).encode()).hexdigest()[:12]
    with tempfile.TemporaryDirectory(prefix="astrai-launch-") as tmp:
        logs = opts.log_dir or str(Path(tmp) / "logs")
        o = LaunchOptions(**{**opts.__dict__, "log_dir": logs})
        try:
            run_workers(_worker, (action, target, progress, tmp), nprocs=config.runtime.nprocs,
                        nnodes=config.runtime.nnodes, launch=o,
                        run_id=run_id if config.runtime.nnodes > 1 else None)
        except ChildFailedError as e:
            got = _read(tmp, "summary")
            if got is not None and got.get("preempted"):  # workers exit 75 when preempted
                return TrainSummary(**got)
            err = _read(tmp, "error")
            if err is not None:
                cls = getattr(astrai.errors, err["type"], AstraiError)
                raise (cls if issubclass(cls, AstraiError) else AstraiError)(err["message"]) \
                    from None
            rank, failure = e.get_first_failure()
            raise WorkerFailed(
                f"worker rank {rank} failed (exit {failure.exitcode}): "
                f"{_first_line(failure.message)}; the other workers were stopped"
            ) from None
        except SignalException as e:
            got = _read(tmp, "summary")
            if got is not None and got.get("preempted"):
                return TrainSummary(**got)
            raise Interrupted(
                f"interrupted by {e.sigval.name} before the workers saved; resume from the "
                f"newest complete checkpoint with `astrai resume {config.out}`",
                128 + int(e.sigval),
            ) from None
        got = _read(tmp, "summary")
        if got is None:  # another node's rank 0 holds the summary
            return None
        return TrainSummary(**got)


def _worker(action: str, target: Any, progress: bool, result_dir: str) -> None:
    """One worker: run the job in place, report rank 0's summary or the first user error."""
    import torch.distributed as dist

    from astrai.train import run

    env = dist_env()
    try:
        action, target = _after_restart(action, target)
        if action == "train":
            summary = run.train(TrainConfig.from_dict(target), progress=progress)
        else:
            summary = run.resume(target["run_dir"], reward=target["reward"],
                                 tensorboard=target["tensorboard"], progress=progress,
                                 layout=target.get("layout"))
    except AstraiError as e:
        _write(result_dir, "error", {"type": type(e).__name__, "message": str(e)}, env.rank)
        sys.exit(e.exit_code)
    if env.rank == 0:
        _write(result_dir, "summary", summary.to_dict(), 0)
    if dist.is_initialized():
        dist.destroy_process_group()
    if summary.preempted:
        sys.exit(EXIT_PREEMPTED)
    from astrai.train import preemption

    if preemption.SIGNAL_SEEN:
        # The signal came too late to stop the run (its last step), but the agent caught it
        # too and now waits for this worker to exit; returning would leave it waiting on
        # torch's result hand-off until the shutdown timeout.
        sys.exit(0)


def _after_restart(action: str, target: Any) -> tuple[str, Any]:
    """What a worker that the agent restarted (--max-restarts) runs: a `train` whose run
    has a complete checkpoint continues from the newest one, as `astrai resume` would;
    every worker sees the same checkpoints (the old workers are all dead by now)."""
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if action != "train" or restarts == 0:
        return action, target
    from astrai.train.checkpointing import list_checkpoints
    from astrai.train.run import run_paths

    config = TrainConfig.from_dict(target)
    if not list_checkpoints(run_paths(config).ckpt_dir):
        return action, target  # failed before its first checkpoint: start again
    return "resume", {"run_dir": config.out, "reward": None, "tensorboard": False,
                      "layout": None}


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker when the agent process dies (kill -9 of `astrai train`
    must not leave orphaned workers training on). Elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the agent died before prctl took effect
        os._exit(1)


def _write(result_dir: str, kind: str, obj: dict, rank: int) -> None:
    # the parent never reads half a file
    write_json_atomic(Path(result_dir) / f"{kind}-{rank}.json", obj, indent=None)


def _read(result_dir: str, kind: str) -> dict | None:
    """The lowest rank's `kind` record (errors: the first that a rank wrote)."""
    files = sorted(Path(result_dir).glob(f"{kind}-*.json"),
                   key=lambda p: int(p.stem.split("-")[1]))
    return json.loads(files[0].read_text()) if files else None


def _first_line(message: str) -> str:
    lines = [x.strip() for x in str(message).splitlines() if x.strip()]
    return lines[-1] if lines else "no message"
