"""FSDP executor: FSDP2 `fully_shard`, parameters, gradients and optimizer state sharded.

* Wrapping: `fully_shard` on every decoder block, then on the root (embeddings, final
  norm, head), so each block's weights are all-gathered just before its forward/backward
  and freed after (torchtitan's layout). Optional CPU offload of the shards (CUDA only).
* Accumulation: on non-sync micro-steps `set_requires_gradient_sync(False)` (FSDP2's
  native switch) keeps unsharded gradients local; the last micro-step
  of a window reduce-scatters them.
* Loss scale: FSDP2 averages gradients over ranks like DDP, hence the same normalizer.
* Clipping: gradients are DTensor shards; the norm of the shards is a partial DTensor whose
  `full_tensor()` is the global L2 norm, so every rank clips by the same factor.
* Checkpoints: `get_model_state_dict` / `get_optimizer_state_dict` with full_state_dict and
  cpu_offload gather full tensors to rank 0. The optimizer state is then re-keyed by
  parameter index, the layout `torch.optim.Optimizer.state_dict()` uses, so optimizer.pt
  is the same file whichever executor wrote it, and resume may switch executors.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor

from astrai.errors import ConfigError
from astrai.model.block import DecoderBlock
from astrai.train.executors import clip_by_norm_
from astrai.train.executors.distributed import DistributedExecutor

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


class FSDPExecutor(DistributedExecutor):
    name = "fsdp"

    def __init__(self, *, reshard_after_forward: bool = True, cpu_offload: bool = False,
                 tp: int = 1, **options: Any) -> None:
        super().__init__(**options)
        if cpu_offload and self.device.type != "cuda":
            raise ConfigError("executor_kwargs.cpu_offload: offloading shards to CPU needs a "
                              "CUDA device; drop cpu_offload or use --device cuda")
        self.reshard_after_forward = reshard_after_forward
        self.cpu_offload = cpu_offload
        self.tp = tp
        self.mesh = None
        if tp > 1:  # a (dp, tp) mesh: tensor_parallel.py
            from astrai.train.executors import tensor_parallel

            self.mesh = tensor_parallel.device_mesh(self.device, self.world_size, tp)

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tp  # the mesh's dp coordinate (ranks are dp-major)

    @property
    def dp_size(self) -> int:
        return self.world_size // self.tp

    def all_reduce_tensor(self, t: torch.Tensor) -> torch.Tensor:
        if self.mesh is None:
            return super().all_reduce_tensor(t)
        out = t.clone()  # the tp ranks of a group hold the same figures: sum over dp only
        torch.distributed.all_reduce(out, group=self.mesh.get_group("dp"))
        return out

    def _wrap(self, model: nn.Module) -> nn.Module:
        offload = CPUOffloadPolicy(pin_memory=True) if self.cpu_offload else OffloadPolicy()
        kw = {"reshard_after_forward": self.reshard_after_forward, "offload_policy": offload}
        if self.mesh is not None:
            from astrai.train.executors import tensor_parallel

            tensor_parallel.parallelize(model, self.mesh["tp"])
            kw["mesh"] = self.mesh["dp"]
        for module in list(model.modules()):
            if isinstance(module, DecoderBlock):
                fully_shard(module, **kw)
        # The root: it owns what no block does. Its weights stay gathered after forward
        # (the head's backward comes right after), as torchtitan does.
        fully_shard(model, **{**kw, "reshard_after_forward": False})
        if getattr(getattr(model, "config", None), "n_experts", 0):
            # An expert no token of this rank chose has no gradient here but may have one
            # on another rank: reduce zeros for it, or the reduce-scatters would not match.
            model.set_reduce_scatter_unused_params(True)
        return model

    @contextlib.contextmanager
    def _no_sync(self, model: FSDPModule):
        model.set_requires_gradient_sync(False)  # recurse=True: every sharded block
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        params = [p for p in self.model.parameters() if p.grad is not None]
        if not params:
            return torch.zeros((), device=self.device)
        if self.mesh is not None:  # gradients on two meshes (tp x dp, and dp)
            from astrai.train.executors import tensor_parallel

            norm = tensor_parallel.total_norm([p.grad for p in params])
            tensor_parallel.clip_(params, max_norm, norm, clip_by_norm_)
            return norm
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type=2.0)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()  # sum of the shards' squares over ranks, then sqrt
        clip_by_norm_(params, max_norm, norm)
        return norm

    # -- checkpoints ---------------------------------------------------------------------------
    def model_state_dict(self) -> dict[str, torch.Tensor]:
        """Collective: every rank calls; rank 0 receives the full CPU state dict."""
        state = get_model_state_dict(self.model, options=FULL)
        return state if self.is_main else {}

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict:
        """Collective; rank 0 receives the full state, keyed by parameter index."""
        state = get_optimizer_state_dict(self.model, optimizer, options=FULL)
        return fqn_to_index(state, self._param_names(optimizer)) if self.is_main else {}

    def load_optimizer_state_dict(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Every rank passes the full state; each keeps its own shards."""
        full = index_to_fqn(state, self._param_names(optimizer))
        set_optimizer_state_dict(self.model, optimizer, full,
                                 options=StateDictOptions(full_state_dict=True))

    def _param_names(self, optimizer: torch.optim.Optimizer) -> list[str]:
        """Fully qualified name of each optimizer parameter, in the optimizer's index order."""
        names = {id(p): n for n, p in self.model.named_parameters()}
        return [names[id(p)] for g in optimizer.param_groups for p in g["params"]]


def fqn_to_index(state: dict, names: list[str]) -> dict:
    """{"state": {fqn: s}, "param_groups": [{"params": [fqn]}]} -> the same keyed by the
    parameter's index in the optimizer (torch.optim's own state_dict layout)."""
    index = {n: i for i, n in enumerate(names)}
    return {
        "state": {index[k]: v for k, v in state["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]}
                         for g in state["param_groups"]],
    }


def index_to_fqn(state: dict, names: list[str]) -> dict:
    """Inverse of fqn_to_index; a state already keyed by name passes through."""
    groups = state.get("param_groups", [])
    if not groups or not groups[0]["params"] or isinstance(groups[0]["params"][0], str):
        return state
    return {
        "state": {names[int(k)]: v for k, v in state["state"].items()},
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in groups],
    }
