"""Joining the process group that torch's launcher prepared.

Both launch paths (`astrai train --nprocs N`, which runs torch's elastic agent in-process,
and an external `torchrun`) start every worker with the torch.distributed environment:

    RANK, WORLD_SIZE            global rank and number of processes (all nodes)
    LOCAL_RANK, LOCAL_WORLD_SIZE   rank and process count on this node (picks cuda:LOCAL_RANK)
    MASTER_ADDR, MASTER_PORT    the TCP store that init_process_group("env://") connects to

Without that environment (a ddp/fsdp executor in a plain process, e.g. a unit test), the
executor forms a group of one over an in-memory store, so the same code path runs.
Backend: nccl for CUDA devices, gloo for CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from astrai.errors import ConfigError

ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
            "MASTER_PORT")


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job, as the launcher's environment says."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    launched: bool = False
    """True when a launcher set WORLD_SIZE (elastic agent or torchrun)."""


def dist_env(environ: dict[str, str] | None = None) -> DistEnv:
    env = os.environ if environ is None else environ
    if "WORLD_SIZE" not in env:
        return DistEnv()
    try:
        ws = int(env["WORLD_SIZE"])
        return DistEnv(rank=int(env.get("RANK", 0)), world_size=ws,
                       local_rank=int(env.get("LOCAL_RANK", 0)),
                       local_world_size=int(env.get("LOCAL_WORLD_SIZE", ws)), launched=True)
    except ValueError:
        raise ConfigError(
            "environment: RANK/WORLD_SIZE/LOCAL_RANK must be integers (set by torchrun or "
            f"astrai train --nprocs); got {{{', '.join(f'{k}={env.get(k)}' for k in ENV_VARS[:3])}}}"
        ) from None


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def local_device(device: torch.device, env: DistEnv) -> torch.device:
    """cuda -> cuda:LOCAL_RANK (one GPU per process); cpu stays cpu."""
    if device.type != "cuda":
        return device
    if device.index is not None and env.local_world_size > 1:
        raise ConfigError(
            f"device: '{device}' names one GPU but {env.local_world_size} processes run on this "
            "node; pass --device cuda (each process takes cuda:LOCAL_RANK)"
        )
    index = device.index if device.index is not None else env.local_rank
    if index >= torch.cuda.device_count():
        raise ConfigError(
            f"device: process LOCAL_RANK {env.local_rank} needs cuda:{index} but only "
            f"{torch.cuda.device_count()} GPU(s) are visible; lower --nprocs"
        )
    return torch.device("cuda", index)


def init_process_group(device: torch.device, timeout_s: float = 1800.0
                       ) -> tuple[DistEnv, torch.device, bool]:
    """(environment, this process's device, whether this call created the group).

    An already initialised group (a caller's, or an earlier run in the same process) is
    reused and left to its owner to destroy."""
    env = dist_env()
    dev = local_device(torch.device(device), env)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)  # so "cuda" without an index means this process's GPU
    if dist.is_initialized():
        env = DistEnv(rank=dist.get_rank(), world_size=dist.get_world_size(),
                      local_rank=env.local_rank, local_world_size=env.local_world_size,
                      launched=env.launched)
        return env, dev, False
    timeout = timedelta(seconds=timeout_s)
    if not env.launched:
        # A group of one over an in-memory store: no launcher, no ports.
        dist.init_process_group(backend_for(dev), store=dist.HashStore(), rank=0,
                                world_size=1, timeout=timeout)
        return env, dev, True
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            raise ConfigError(
                f"environment: WORLD_SIZE is set but {var} is not; start workers with torchrun "
                "or `astrai train --nprocs N`, which set the whole torch.distributed environment"
            )
    dist.init_process_group(backend_for(dev), timeout=timeout,
                            device_id=dev if dev.type == "cuda" else None)
    return env, dev, True


def destroy_process_group(owned: bool) -> None:
    if owned and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(value: float, device: torch.device) -> float:
    """Sum of `value` over all ranks (float64, so counts stay exact)."""
    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item())


def expected_world_size(config) -> int:
    """Processes in the run: the launcher's WORLD_SIZE inside a launched worker, else the
    nnodes x nprocs that `astrai train` will start."""
    env = dist_env()
    return env.world_size if env.launched else config.runtime.nnodes * config.runtime.nprocs


def check_parallel(config, world_size: int, device: torch.device) -> None:
    """One-line errors for parallel settings that cannot work."""
    if world_size > 1 and config.runtime.parallel == "none":
        raise ConfigError(
            f"parallel: {world_size} processes but parallel is 'none'; pass --parallel ddp "
            "(replicated weights) or --parallel fsdp (sharded weights)"
        )
    if device.type == "cuda" and not dist_env().launched:
        visible = torch.cuda.device_count()
        if config.runtime.nprocs > visible:
            raise ConfigError(
                f"nprocs: {config.runtime.nprocs} processes need one GPU each but {visible} are "
                "visible; lower --nprocs or set CUDA_VISIBLE_DEVICES"
            )


def check_tensor_parallel(config, world_size: int, model_config) -> None:
    """One-line errors for a --tp that cannot split this model over this many processes:
    each rank runs H / tp query heads and K / tp key/value heads (grouped-query attention
    keeps each kv head with its query heads), and the data-parallel groups are whole."""
    tp = config.runtime.tp
    if tp == 1:
        return
    if world_size % tp:
        raise ConfigError(f"tp: {tp} does not divide the {world_size} processes "
                          "(nnodes x nprocs); choose a --tp that divides them")
    mc = model_config
    for name, n in (("n_heads", mc.n_heads), ("n_kv_heads", mc.kv_heads)):
        if n % tp:
            raise ConfigError(f"tp: {tp} does not divide the model's {name} ({n}); each rank "
                              "needs whole attention heads: choose a --tp that divides "
                              f"{name}")
    for name, n in (("ffn_dim", mc.ffn_dim), ("vocab_size", mc.vocab_size)):
        if n % tp:
            raise ConfigError(f"tp: {tp} does not divide the model's {name} ({n}); choose a "
                              f"--tp that divides {name}")
    if mc.n_experts:
        raise ConfigError("tp: mixture-of-experts layers are not tensor-parallel; drop --tp "
                          "(fsdp alone shards them)")
