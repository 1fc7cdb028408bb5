"""The numbers of a run, as pure functions: total steps, effective batch, memory estimate.

Total optimizer steps (docs/train.md):

    samples_per_replica = ceil(dataset_len / nprocs)
    batches_per_replica = ceil(samples_per_replica / batch_per_device)
    total_steps         = (batches_per_replica // grad_accum_steps) * n_epoch
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from astrai.model.config import ModelConfig
from astrai.model.stats import flops_per_token, param_counts


def windows_per_epoch(dataset_len: int, batch_size: int, grad_accum_steps: int,
                      world_size: int = 1) -> int:
    """Optimizer steps one epoch holds on each rank."""
    samples_per_replica = math.ceil(dataset_len / world_size)
    batches_per_replica = math.ceil(samples_per_replica / batch_size)
    return batches_per_replica // grad_accum_steps


def total_steps(dataset_len: int, batch_size: int, grad_accum_steps: int, world_size: int,
                epochs: int, max_steps: int | None = None) -> int:
    """max_steps when given (epochs then continue as needed), else the formula above."""
    if max_steps is not None:
        return max_steps
    return windows_per_epoch(dataset_len, batch_size, grad_accum_steps, world_size) * epochs


def warmup_steps(total: int, warmup_ratio: float, warmup: int | None = None) -> int:
    return min(total, warmup if warmup is not None else round(warmup_ratio * total))


UPDATE_MODES = (("fp32", "nearest"), ("bf16-mixed", "nearest"), ("bf16-true", "nearest"),
                ("bf16-true", "stochastic"), ("bf16-true", "kahan"))


def bytes_per_param(precision: str, bf16_update: str = "nearest", *, state_bytes: int = 4,
                    muon_share: float = 0.0) -> dict[str, float]:
    """Bytes each trained parameter holds: weight + gradient (2 each for bf16-true, else 4)
    + optimizer state: two AdamW moments of `state_bytes` (one momentum buffer for the
    `muon_share` of parameters Muon trains), plus Kahan's bf16 compensation (2). Stochastic
    rounding adds only its generators (a few KB per device)."""
    weight = 2 if precision == "bf16-true" else 4
    state = (2 - muon_share) * state_bytes + (2 if bf16_update == "kahan" else 0)
    return {"weights": weight, "gradients": weight, "optimizer": round(state, 3),
            "total": round(2 * weight + state, 3)}


def bytes_per_param_table(state_bytes: int = 4, muon_share: float = 0.0
                          ) -> dict[str, dict[str, float]]:
    """bytes_per_param of every precision / --bf16-update pair (what --dry-run lists)."""
    return {(p if p != "bf16-true" else f"{p} {u}"): bytes_per_param(
        p, u, state_bytes=state_bytes, muon_share=muon_share) for p, u in UPDATE_MODES}


def memory_estimate(config: ModelConfig, batch_size: int, seq_len: int, *,
                    param_bytes: int = 4, act_bytes: int = 4,
                    gradient_checkpointing: bool = False, state_bytes: int = 4,
                    shards: int = 1, trainable: int | None = None,
                    muon_params: int = 0, kahan: bool = False) -> dict[str, int]:
    """Rough peak bytes on one device: weights + grads (param_bytes each) + the two AdamW
    moments (state_bytes each; Muon's `muon_params` have one momentum buffer; `kahan`: a
    2-byte compensation per parameter) + activations; FSDP divides the first three by
    `shards`.
    `trainable`: a LoRA run's adapter parameters (fp32, with fp32 gradients and moments);
    the base then has neither gradients nor moments.

    Activations per block follow Korthikanti et al. 2022 (Table 2, no parallelism) scaled
    to our element size: B*T*(17*C + 2.5*H*T) elements, plus the fp32 logits and their
    gradient (B*T*V*2). With gradient checkpointing only each block's input is kept.
    """
    n = param_counts(config).total
    B, T, C, H, L, V = batch_size, seq_len, config.dim, config.n_heads, config.n_layers, \
        config.vocab_size
    per_block = B * T * (17 * C + 2.5 * H * T) * act_bytes
    if gradient_checkpointing:
        acts = L * B * T * C * act_bytes + per_block
    else:
        acts = L * per_block
    logits = B * T * V * 4 * 2
    out = {
        "weights": n * param_bytes // shards, "gradients": n * param_bytes // shards,
        "optimizer": ((n * 2 - muon_params) * state_bytes + (2 * n if kahan else 0)) // shards,
        "activations": int(acts + logits),
    }
    if trainable is not None:
        out.update(weights=out["weights"] + trainable * 4, gradients=trainable * 4,
                   optimizer=trainable * 2 * 4)
    out["total"] = sum(out.values())
    return out


@dataclass
class TrainPlan:
    """What `astrai train --dry-run` prints."""

    strategy: str
    dataset: str
    dataset_kind: str
    dataset_samples: int
    seq_len: int
    model: str
    params: int
    world_size: int
    batch_size: int
    grad_accum_steps: int
    effective_batch: int
    tokens_per_step: int
    windows_per_epoch: int
    epochs: float
    total_steps: int
    warmup_steps: int
    total_tokens: int
    flops_per_token: int
    schedule: str
    max_lr: float
    min_lr: float
    device: str
    precision: str
    memory_bytes: dict[str, int]
    parallel: str = "none"
    nnodes: int = 1
    nprocs: int = 1
    tp: int = 1
    """Tensor-parallel degree; data-parallel groups = world_size / tp."""
    optimizer_state_dtype: str = "fp32"
    compile: str = "none"
    gradient_checkpointing: bool = False
    trainable_params: int | None = None
    """LoRA runs: the adapters' parameters (the rest is frozen); None = every parameter."""
    optimizer: str = "adamw"
    param_groups: list[dict] | None = None
    """The optimizer's parameter groups (name, optimizer, tensors, params, lr, weight_decay);
    None for LoRA runs (AdamW on the adapters)."""
    bf16_update: str = "nearest"
    bytes_per_param: dict[str, dict[str, float]] | None = None
    """Weights + gradients + optimizer state per trained parameter for each precision and
    --bf16-update mode (bytes_per_param_table); None for LoRA runs (fp32 adapters)."""

    def to_dict(self) -> dict:
        return asdict(self)


def lora_params(config: ModelConfig, rank: int, targets: tuple[str, ...]) -> int:
    """Parameters of rank-`rank` adapters on `targets`: r * (in + out) per adapted layer."""
    C, F, H, K, D = config.dim, config.ffn_dim, config.n_heads, config.kv_heads, config.hdim
    shape = {"q_proj": (C, H * D), "k_proj": (C, K * D), "v_proj": (C, K * D),
             "o_proj": (H * D, C), "gate_proj": (C, F), "up_proj": (C, F), "down_proj": (F, C)}
    return config.n_layers * sum(rank * sum(shape[t]) for t in targets)


def _trainable(config, model_config: ModelConfig) -> int | None:
    """A LoRA run's adapter parameters (None: full training)."""
    spec = config.lora.spec
    if spec is None and config.lora.adapter:
        from astrai.model.adapter import read_adapter_spec

        spec = read_adapter_spec(config.lora.adapter)
    return None if spec is None else lora_params(model_config, spec.rank, spec.targets)


def make_plan(*, config, model_config: ModelConfig, model_desc: str, dataset_kind: str,
              dataset_len: int, seq_len: int, world_size: int, device: str,
              precision: str, param_groups: list[dict] | None = None) -> TrainPlan:
    dp = world_size // config.runtime.tp  # data-parallel groups: tp ranks share a batch
    wpe = windows_per_epoch(dataset_len, config.batch_size, config.grad_accum_steps, dp)
    total = total_steps(dataset_len, config.batch_size, config.grad_accum_steps, dp,
                        config.epochs, config.max_steps)
    eff = dp * config.batch_size * config.grad_accum_steps
    trainable = _trainable(config, model_config)
    muon = sum(g["params"] for g in param_groups or [] if g["optimizer"] == "muon")
    state_bytes = 2 if config.precision.optimizer_state_dtype == "bf16" else 4
    n = param_counts(model_config).total
    update = config.precision.update_mode
    return TrainPlan(
        strategy=config.strategy, dataset=str(config.data), dataset_kind=dataset_kind,
        dataset_samples=dataset_len, seq_len=seq_len, model=model_desc,
        params=param_counts(model_config).total, world_size=world_size,
        batch_size=config.batch_size, grad_accum_steps=config.grad_accum_steps,
        effective_batch=eff, tokens_per_step=eff * seq_len, windows_per_epoch=wpe,
        epochs=round(total / wpe, 3) if wpe else 0.0, total_steps=total,
        warmup_steps=warmup_steps(total, config.schedule.warmup_ratio,
                                  config.schedule.warmup_steps),
        total_tokens=total * eff * seq_len,
        flops_per_token=flops_per_token(model_config, seq_len, training=True),
        schedule=config.schedule.name, max_lr=config.optimizer.max_lr,
        min_lr=config.optimizer.min_lr_value,
        device=device, precision=precision,
        memory_bytes=memory_estimate(
            model_config, config.batch_size, seq_len,
            param_bytes=2 if precision == "bf16-true" else 4,
            act_bytes=2 if precision.startswith("bf16") else 4,
            gradient_checkpointing=config.runtime.gradient_checkpointing,
            state_bytes=state_bytes,
            shards=world_size if config.runtime.parallel == "fsdp" else 1, trainable=trainable,
            muon_params=muon, kahan=update == "kahan" and precision == "bf16-true"),
        parallel=config.runtime.parallel, nnodes=config.runtime.nnodes,
        nprocs=config.runtime.nprocs, tp=config.runtime.tp,
        optimizer_state_dtype=config.precision.optimizer_state_dtype,
        compile=config.runtime.compile,
        gradient_checkpointing=config.runtime.gradient_checkpointing, trainable_params=trainable,
        optimizer=config.optimizer.name, param_groups=param_groups, bf16_update=update,
        bytes_per_param=None if trainable is not None else bytes_per_param_table(
            state_bytes, muon / n if n else 0.0),
    )
