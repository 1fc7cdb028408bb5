"""Worker functions for the multi-process tests (imported by spawned workers, so they live
at module level). Every worker builds the same in-memory data; RDSampler shards it by rank.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist

from astrai.train import resume, train
from astrai.train.callbacks import Callback

from .conftest import make_config, make_data

N_SAMPLES = 32  # a multiple of 8: 1 x 8 and 2 x 4 see the same rows per step


def data_for(kind: str, n: int = N_SAMPLES):
    data = make_data(kind, n=n)
    data.sampler_fn = None  # astrai's RDSampler: rank r takes rows r, r + W, ...
    return data


def config_for(out: Path, kind: str, **kw):
    base = {"strategy": "seq" if kind == "pretrain" else "sft", "max_lr": 1e-4,
            "grad_accum_steps": 2, "max_steps": 3, "label_smoothing": 0.1}
    return make_config(out, **{**base, **kw})


def compiled(mode: str, backend: str = "aot_eager") -> dict:
    """Options of a compiled, activation-checkpointed run. aot_eager runs dynamo and AOT
    autograd (what meets the DDP/FSDP hooks) without inductor's C++ build, in seconds."""
    return {"compile": mode, "compile_backend": backend, "gradient_checkpointing": True,
            "gradient_checkpointing_modules": ["Attention", "SwiGLU"] if mode == "model"
            else ["DecoderBlock"]}


class CommCounter(Callback):
    """Gradient-reduction calls seen after each micro-batch (DDP: a counting comm hook on
    every bucket; FSDP: counting reduce-scatters)."""

    name = "comm_counter"

    def __init__(self):
        self.calls, self.after_batch, self._restore = 0, [], None

    def on_train_begin(self, ctx):
        if ctx.executor.name == "ddp":
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            def hook(state, bucket):
                self.calls += 1
                return allreduce_hook(state, bucket)

            ctx.model.register_comm_hook(None, hook)
        else:
            names = [n for n in ("reduce_scatter_single", "reduce_scatter_tensor")
                     if hasattr(dist, n)]
            originals = {n: getattr(dist, n) for n in names}

            def counted(fn):
                def wrapper(*a, **k):
                    self.calls += 1
                    return fn(*a, **k)
                return wrapper

            for n in names:
                setattr(dist, n, counted(originals[n]))
            self._restore = originals

    def on_batch_end(self, ctx, micro):
        self.after_batch.append(self.calls)

    def on_train_end(self, ctx):
        for n, fn in (self._restore or {}).items():
            setattr(dist, n, fn)


class Interrupt(Exception):
    pass


class StopAfterStep(Callback):
    name = "stop"

    def __init__(self, step):
        self.step = step

    def on_batch_begin(self, ctx, micro):
        if ctx.state.step == self.step:
            raise Interrupt  # every rank at the same micro-batch: a simulated crash


def scenarios(out_root: str, names: list[str]) -> dict:
    """Run each named scenario in this worker (the process group is created once, by the
    first executor, and reused)."""
    out, results = Path(out_root), {}
    for name in names:
        parallel, kind, what = name.split("-")
        run = out / name
        if what == "train":
            counter = CommCounter()
            train(config_for(run, kind, parallel=parallel), data=data_for(kind),
                  callbacks=[counter])
            results[name] = counter.after_batch
        elif what == "resume":
            kw = {"parallel": parallel, "max_steps": 4, "ckpt_interval": 2}
            try:
                train(config_for(run, kind, **kw), data=data_for(kind),
                      callbacks=[StopAfterStep(3)])
            except Interrupt:
                pass
            summary = resume(run / "run", data=data_for(kind))
            results[name] = summary.resumed_from
        elif what == "muon":
            train(config_for(run, kind, parallel=parallel, optimizer="muon"),
                  data=data_for(kind))
        elif what == "stochastic":  # bf16-true weights, --bf16-update stochastic
            results[name] = stochastic_scenario(run, kind, parallel)
        elif what in ("block", "model"):  # torch.compile + activation checkpointing
            train(config_for(run, kind, parallel=parallel, **compiled(what)), data=data_for(kind))
    return results


class LocalWeights(Callback):
    """This rank's own (local shard of the) weights at the end, as float64 sums."""

    name = "local_weights"

    def on_train_end(self, ctx):
        self.sums = [float(getattr(p, "_local_tensor", p).double().sum())
                     for p in ctx.model.parameters()]


def stochastic_scenario(run: Path, kind: str, parallel: str) -> dict:
    """A bf16-true stochastic-rounding run of 4 steps, straight and interrupted after step 3
    then resumed: each rank's final local weights of both."""
    kw = {"parallel": parallel, "precision": "bf16-true", "bf16_update": "stochastic",
          "max_steps": 4, "ckpt_interval": 2, "max_lr": 1e-2}
    straight = LocalWeights()
    train(config_for(run / "straight", kind, **kw), data=data_for(kind), callbacks=[straight])
    try:
        train(config_for(run / "cut", kind, **kw), data=data_for(kind),
              callbacks=[StopAfterStep(3)])
    except Interrupt:
        pass
    return {"straight": straight.sums, "resumed": _resume_sums(run / "cut" / "run", kind)}


def _resume_sums(run_dir: Path, kind: str) -> list[float]:
    cb = LocalWeights()
    resume(run_dir, data=data_for(kind), callbacks=[cb])
    return cb.sums


def losses(run_dir: Path) -> list[float]:
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x)["loss"] for x in lines]


def weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    """The weights of checkpoint step_N, either format (fsdp runs write DCP by default)."""
    from astrai.model.checkpoint import load_checkpoint

    model, _, _ = load_checkpoint(Path(run_dir) / "checkpoints" / f"step_{step}")
    return model.state_dict()


DCP_LAYOUT = {"none": {"parallel": "none", "nprocs": 1, "batch_size": 4, "grad_accum_steps": 4},
              "ddp": {"parallel": "ddp", "nprocs": 2, "batch_size": 4, "grad_accum_steps": 2},
              "fsdp": {"parallel": "fsdp", "nprocs": 2, "batch_size": 4, "grad_accum_steps": 2}}
"""The same global batch (16 samples per step) on one process and on two; one process
accumulates 4 micro-batches where two accumulate 2 each."""


def dcp_cut(run: Path, parallel: str, fmt: str = "dcp", **kw) -> None:
    """A run of 4 steps (checkpoint every 2, DCP unless `fmt`) that crashes in step 4: it
    leaves step_2 and step_3 (the last good state, saved on the error)."""
    cfg = config_for(run, "pretrain", max_steps=4, ckpt_interval=2, checkpoint_format=fmt,
                     **DCP_LAYOUT[parallel], **kw)
    try:
        train(cfg, data=data_for("pretrain"), callbacks=[StopAfterStep(3)])
    except Interrupt:
        pass


def dcp_scenarios(out_root: str, names: list[str]) -> dict:
    """2-process DCP scenarios: `cut:DIR:fsdp` (an async fsdp run in DIR stopped after
    step 3), `resume:DIR:LAYOUT` (the cut run in DIR continued on LAYOUT)."""
    out, results = Path(out_root), {}
    for name in names:
        what, where, layout = name.split(":")
        if what == "cut":
            dcp_cut(out / where, layout, async_checkpoint=True)
        else:
            summary = resume(out / where / "run", data=data_for("pretrain"),
                             layout=DCP_LAYOUT[layout])
            results[name] = summary.resumed_from
    return results


TP_MODEL = {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 8,
            "ffn_dim": 64, "max_seq_len": 64}
"""A tiny model whose heads (4) and kv heads (2) split over tp = 2."""
TIED = {**TP_MODEL, "tie_embeddings": True}

TP_LAYOUT = {"2x2": {"parallel": "fsdp", "nprocs": 4, "tp": 2, "batch_size": 4},
             "4x1": {"parallel": "fsdp", "nprocs": 4, "tp": 1, "batch_size": 2},
             "1": {"parallel": "none", "nprocs": 1, "tp": 1, "batch_size": 8}}
"""The same global batch (8 samples per step): dp 2 x batch 4, dp 4 x batch 2, 1 x 8."""


def tp_eval_data():
    """data_for("pretrain") with 10 validation rows (5 per dp group of 2, batch 4: the
    second batch of each group is short)."""
    data = make_data("pretrain", n=N_SAMPLES, eval_n=10)
    data.sampler_fn = None
    return data


def tp_config(run: Path, layout: str, **kw):
    base = {"model_overrides": TP_MODEL, "max_steps": 4, "ckpt_interval": 2}
    return config_for(run, "pretrain", **{**base, **TP_LAYOUT[layout], **kw})


class Layout(Callback):
    """How the first block's projections and the head are placed on this rank."""

    name = "layout"

    def on_train_begin(self, ctx):
        attn = ctx.model.layers[0].attn
        self.got = {"heads": [attn.n_heads, attn.n_kv_heads],
                    **{n: (m.weight.device_mesh.mesh_dim_names, str(m.weight.placements[-1]))
                       for n, m in (
                        ("q_proj", attn.q_proj), ("o_proj", attn.o_proj),
                        ("down_proj", ctx.model.layers[0].mlp.down_proj),
                        ("lm_head", ctx.model.lm_head), ("embed", ctx.model.embed_tokens))}}


def tp_scenarios(out_root: str) -> dict:
    """On 4 processes: a straight 2 x 2 (dp x tp) run of 4 steps, and one cut after step 3
    resumed as 4 x 1 (fsdp over 4, no tp) from its DCP checkpoint."""
    out = Path(out_root)
    layout = Layout()
    train(tp_config(out / "straight", "2x2"), data=data_for("pretrain"), callbacks=[layout])
    try:
        train(tp_config(out / "cut", "2x2"), data=data_for("pretrain"),
              callbacks=[StopAfterStep(3)])
    except Interrupt:
        pass
    summary = resume(out / "cut" / "run", data=data_for("pretrain"), layout=TP_LAYOUT["4x1"])
    train(tp_config(out / "tied", "2x2", max_steps=2, model_overrides=TIED, eval_interval=1),
          data=tp_eval_data())
    return {"resumed_from": summary.resumed_from, "layout": layout.got}
