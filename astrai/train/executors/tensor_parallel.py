"""Tensor parallelism (Megatron-LM's layout, Shoeybi et al. 2019), applied to a plain model
by one function before FSDP2 shards it over the data-parallel dimension of a 2-D mesh.

    mesh = device_mesh(device, world_size, tp)     # (dp, tp); ranks r..r+tp-1 share a batch
    parallelize(model, mesh["tp"])                 # projections split over the tp ranks
    fully_shard(..., mesh=mesh["dp"])              # then sharded over the dp ranks

In every decoder block q/k/v and the MLP's gate/up are column-parallel (each tp rank
computes its own heads / its own slice of the hidden width) and o/down row-parallel (one
all-reduce each joins the partial sums), so the residual stream between blocks stays a
replicated plain tensor. Each rank's attention runs n_heads / tp query heads and
n_kv_heads / tp key/value heads: grouped-query attention keeps every kv head on the rank of
its query heads. Untied embeddings and head are vocab-parallel (the embedding looks up its
rows and all-reduces; the head computes its vocabulary slice and the logits are
all-gathered), so the loss sees full logits and every strategy's loss works unchanged
(loss parallelism, which keeps logits sharded into the cross-entropy, is not used: the
strategies' losses take whole rows of logits). A tied embedding/head stays replicated over
tp (FSDP still shards it over dp). Norms are replicated: every tp rank computes the same
norm gradient. This is the plan torchtitan's llama parallelizes with, without its
sequence parallelism (norms on sequence shards), which pays only at long sequences.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from astrai.model.block import DecoderBlock


def device_mesh(device: torch.device, world_size: int, tp: int) -> DeviceMesh:
    """The (dp, tp) mesh over the default process group: rank = dp_index * tp + tp_index,
    so a tp group is tp consecutive ranks (one node's GPUs under a launcher)."""
    return init_device_mesh(device.type, (world_size // tp, tp), mesh_dim_names=("dp", "tp"))


def block_plan() -> dict[str, object]:
    """A decoder block's plan: column-parallel in, row-parallel out, per sub-layer."""
    return {"attn.q_proj": ColwiseParallel(), "attn.k_proj": ColwiseParallel(),
            "attn.v_proj": ColwiseParallel(), "attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel()}


def parallelize(model: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """Split `model`'s projections over the 1-D tp `mesh`, in place (module docstring)."""
    tp = mesh.size()
    for module in model.modules():
        if isinstance(module, DecoderBlock):
            parallelize_module(module, mesh, block_plan())
            module.attn.n_heads //= tp  # the local heads each rank's attention runs
            module.attn.n_kv_heads //= tp
        lm_head = getattr(module, "lm_head", None)
        if hasattr(module, "embed_tokens") and isinstance(lm_head, nn.Linear):
            parallelize_module(module, mesh, {
                "embed_tokens": RowwiseParallel(input_layouts=Replicate(),
                                                output_layouts=Replicate()),
                "lm_head": ColwiseParallel(output_layouts=Replicate()),
            })
    return model


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The global L2 norm of gradients that are DTensors on the 2-D mesh (split weights:
    sharded over dp and tp) or on its dp dimension (weights replicated over tp). Each rank
    sums its local squares (fp64), a replicated piece divided by its number of copies so
    that it counts once, as in one process; one all-reduce over every rank then gives all
    of them the same norm (DTensor's own reduction of a 2-D partial norm runs one
    all-reduce per mesh dimension, in an order that may differ between ranks)."""
    world, sums = dist.get_world_size(), []
    for g in grads:
        mesh = g.device_mesh  # ranks outside it (the other tp ranks of a dp mesh) hold copies
        copies = world // mesh.size() * math.prod(
            mesh.size(i) for i, p in enumerate(g.placements) if p.is_replicate())
        local = g.to_local()
        sums.append(torch.linalg.vector_norm(local, dtype=torch.float64).square() / copies)
    sq = torch.stack(sums).sum()
    dist.all_reduce(sq)  # the world: every element of every gradient once
    return sq.sqrt().to(grads[0].dtype)


def clip_(params: list[torch.Tensor], max_norm: float, norm: torch.Tensor, clip) -> None:
    """`clip(params, max_norm, norm)` one mesh at a time (a foreach over DTensors needs
    one mesh)."""
    by_mesh: dict[object, list[torch.Tensor]] = {}
    for p in params:
        key = p.grad.device_mesh if isinstance(p.grad, DTensor) else None
        by_mesh.setdefault(key, []).append(p)
    for group in by_mesh.values():
        clip(group, max_norm, norm)
