"""End-to-end figures of one GPU: training MFU, decode HBM bandwidth, chat on the cuda backend.

    python benchmarks/gpu_e2e.py --json e2e.json                 # on a CUDA machine
    python benchmarks/gpu_e2e.py --dry --json e2e.json           # CPU, tiny preset, seconds

(1) train: the preset in bf16-mixed (fp32 master weights, bf16 autocast), fused AdamW,
    `compile: block`, sequence 2048, through astrai's Trainer (clipping included, no
    checkpoint written), once plain and once with activation checkpointing: tokens/s, MFU
    (PaLM FLOPs per token, astrai.model.stats) against the device's datasheet bf16 dense peak
    (astrai.train.flops.DEVICE_SPECS), peak memory.
(2) decode: greedy decode through the inference Engine at batch 1 and 32: tokens/s and the
    achieved HBM bandwidth = bytes read per decode step (every weight but the embedding
    table, once per step, plus each sequence's KV cache) / the step's time, against the
    datasheet HBM bandwidth ("Roofline: an insightful visual performance model", Williams et
    al., for bytes moved over time as the memory-bound measure).
(3) chat: `astrai chat --prompt` greedy on the cuda backend equals torch_native's reply.

Figures are written to the JSON after every part, so a run cut short keeps what it measured.
The dry run takes the same code paths on the CPU, with ceilings measured on this machine
(a large matmul and a large copy) instead of the datasheet's.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from astrai.config.train import TrainConfig
from astrai.infer.config import CacheConfig
from astrai.infer.engine import Engine
from astrai.infer.params import SamplingParams
from astrai.model import build_model, get_preset
from astrai.model.checkpoint import save_checkpoint
from astrai.model.stats import flops_per_token
from astrai.model.transformer import Transformer
from astrai.train.builder import build_context, prepare
from astrai.train.callbacks import Callback
from astrai.train.data import TrainData
from astrai.train.flops import device_spec, measure_peak_flops
from astrai.train.trainer import Trainer

TARGET_MFU = 0.55  # TinyLlama reports 56% MFU for its 1.1B model on A100-40G
TARGET_DECODE_HBM = 0.80  # of HBM bandwidth at batch 1


# -- ceilings -------------------------------------------------------------------------------
def ceilings(device: torch.device) -> dict[str, Any]:
    """bf16 FLOP/s and memory bytes/s the figures divide by: the datasheet's for a known
    GPU, else measured here (a 2048^3 matmul, a 256 MiB copy)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    spec = device_spec(name) if device.type == "cuda" else None
    if spec is not None:
        return {"device_name": name, "peak_source": spec.source, "spec": spec.name,
                "peak_bf16_tflops": spec.bf16_tflops, "peak_hbm_gbs": spec.hbm_gbs}
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"device_name": name, "peak_source": "measured on this machine", "spec": None,
            "peak_bf16_tflops": measure_peak_flops(str(device), dtype, n=2048) / 1e12,
            "peak_hbm_gbs": copy_bandwidth(device) / 1e9}


def copy_bandwidth(device: torch.device, mib: int = 256, repeats: int = 5) -> float:
    """Bytes/s of the best of `repeats` copies of a `mib` MiB tensor, read and write counted."""
    src = torch.empty(mib * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * src.numel() / best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- (1) training ---------------------------------------------------------------------------
class RandomRows(torch.utils.data.Dataset):
    """`n` rows of uniform random token ids (throughput does not depend on their values)."""

    def __init__(self, n: int, seq_len: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, vocab, (n, seq_len + 1), generator=g)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i, :-1], "target_ids": self.tokens[i, 1:]}


def _stack(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {k: torch.stack([s[k] for s in samples]) for k in samples[0]}


class StepTimer(Callback):
    """Seconds of each optimizer step, end to end (data, forward, backward, clip, AdamW),
    synchronised with the device so queued kernels are counted in their own step."""

    name = "step_timer"

    def __init__(self, device: torch.device) -> None:
        self.device, self.times = device, []

    def on_train_begin(self, ctx) -> None:
        _sync(self.device)
        self.start = time.perf_counter()

    def on_step_end(self, ctx, report, control) -> None:
        _sync(self.device)
        now = time.perf_counter()
        self.times.append(now - self.start)
        self.start = now


class UnsavedTrainer(Trainer):
    """astrai's Trainer, every checkpoint write left out (a 1.2B checkpoint with its AdamW
    moments is ~14 GB: seconds of disk time that are not training)."""

    def save(self) -> None:
        self.last_saved = self.ctx.state.step


def train_figures(preset: str, *, device: torch.device, precision: str, compile: str,
                  seq_len: int, batch: int, steps: int, warmup: int, checkpointing: bool,
                  peak_tflops: float, vocab_size: int | None = None
                  ) -> tuple[dict[str, Any], torch.nn.Module]:
    """Train `steps` steps (the first `warmup` compile and are not timed); the figures and
    the trained model. No checkpoint is written; the run directory is a temporary one."""
    overrides = {"vocab_size": vocab_size} if vocab_size else {}
    cfg = get_preset(preset, **overrides)
    data = TrainData(dataset=RandomRows(batch * steps, seq_len, cfg.vocab_size),
                     kind="pretrain", seq_len=seq_len, collate_fn=_stack,
                     vocab_size=cfg.vocab_size)
    with tempfile.TemporaryDirectory() as tmp:
        config = TrainConfig(model=preset, model_overrides=overrides, out=str(Path(tmp) / "run"),
                             batch_size=batch, max_steps=steps, warmup_steps=0, ckpt_interval=0,
                             device=str(device), precision=precision, compile=compile,
                             gradient_checkpointing=checkpointing)
        ctx, _ = build_context(prepare(config, data))
        timer = StepTimer(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        UnsavedTrainer(ctx, [timer]).train()
    timed = timer.times[warmup:] or timer.times
    step_s = statistics.median(timed)
    tokens_per_s = batch * seq_len / step_s
    achieved = tokens_per_s * flops_per_token(cfg, seq_len, training=True)
    fused = [g.get("fused") for g in ctx.optimizer.param_groups] if hasattr(
        ctx.optimizer, "param_groups") else []
    figures = {
        "preset": preset, "params": sum(p.numel() for p in ctx.model.parameters()),
        "precision": precision, "compile": compile, "activation_checkpointing": checkpointing,
        "fused_adamw": bool(fused) and all(bool(f) for f in fused),
        "seq_len": seq_len, "batch": batch, "steps": len(timer.times), "timed_steps": len(timed),
        "step_s": step_s, "compile_warmup_s": sum(timer.times[:warmup]),
        "tokens_per_s": tokens_per_s, "achieved_tflops": achieved / 1e12,
        "mfu": achieved / (peak_tflops * 1e12),
        "peak_memory_gib": (torch.cuda.max_memory_allocated(device) / 2**30
                            if device.type == "cuda" else 0.0),
        "final_loss": ctx.last_loss if ctx.last_loss is not None else float("nan"),
    }
    return figures, ctx.model


# -- (2) decode -----------------------------------------------------------------------------
def uncompiled_copy(model: torch.nn.Module, dtype: torch.dtype) -> Transformer:
    """The trained weights in a fresh Transformer without the training run's compiled blocks
    (a block compiled for training would recompile at every decode shape and layer)."""
    with torch.device(next(model.parameters()).device):
        fresh = Transformer(model.config)
    fresh.load_state_dict(model.state_dict())
    return fresh.to(dtype).eval()


def decode_bytes_per_step(model: torch.nn.Module, batch: int, context: float,
                          kv_bytes_per_token: int) -> float:
    """HBM bytes one decode step reads: every parameter but the embedding table once (a
    tied table is read as the LM head), then `context` cached tokens of K and V per sequence."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    if not model.config.tie_embeddings:  # the table is only gathered: batch rows of it
        emb = model.embed_tokens.weight
        params -= emb.numel() * emb.element_size()
    return params + batch * context * kv_bytes_per_token


def decode_figures(model: torch.nn.Module, *, batch: int, prompt_len: int, new_tokens: int,
                   backend: str | None, peak_hbm_gbs: float) -> dict[str, Any]:
    """Greedy decode of `batch` random prompts through the Engine; times decode-only steps."""
    cfg = model.config
    context = prompt_len + new_tokens
    engine = Engine(model, None, CacheConfig(max_requests=batch, max_context=context,
                                             max_kv_tokens=batch * (context + 32), radix=False),
                    backend)
    g = torch.Generator().manual_seed(batch)
    prompts = torch.randint(0, cfg.vocab_size, (batch, prompt_len), generator=g).tolist()
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    engine.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=0.0,
                                                ignore_eos=True))  # warm-up
    steps: list[tuple[float, int]] = []

    def on_step(info) -> None:
        if info.num_prefill_tokens == 0 and info.num_decode_tokens:
            steps.append((info.duration, info.num_decode_tokens))

    engine.on_step = on_step
    outs = engine.generate(prompts, params)
    decode_s = sum(d for d, _ in steps)
    decode_tokens = sum(n for _, n in steps)
    kv_dtype = CacheConfig().torch_dtype(next(model.parameters()).dtype)  # the pool's
    kv_per_token = 2 * cfg.n_layers * cfg.kv_heads * cfg.hdim * kv_dtype.itemsize
    # a decode step of context c reads c cached tokens; c runs prompt_len .. +new_tokens-1
    mean_context = prompt_len + new_tokens / 2
    bytes_read = len(steps) * decode_bytes_per_step(model, batch, mean_context, kv_per_token)
    gbs = bytes_read / max(decode_s, 1e-12) / 1e9
    return {
        "batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens,
        "backend": engine.backend().name,
        "generated": sum(len(o.token_ids) for o in outs), "decode_steps": len(steps),
        "decode_s": decode_s, "tokens_per_s": decode_tokens / max(decode_s, 1e-12),
        "ms_per_step": 1e3 * decode_s / max(len(steps), 1),
        "bytes_per_step": bytes_read / max(len(steps), 1), "hbm_gbs": gbs,
        "hbm_fraction": gbs / peak_hbm_gbs,
    }


# -- (3) chat -------------------------------------------------------------------------------
def chat_figures(workdir: Path, *, device: str, dtype: str, backends: tuple[str, str],
                 max_tokens: int = 32) -> dict[str, Any]:
    """`astrai chat --prompt` greedy (tiny preset, its own tokenizer) under two backends
    (a name, or "auto" for the engine's own choice)."""
    from astrai.data.testing import tiny_tokenizer

    tok = tiny_tokenizer(workdir, vocab_size=512)
    cfg = get_preset("tiny", vocab_size=512)
    ckpt = save_checkpoint(workdir / "chat-ckpt", build_model(cfg, seed=0), cfg,
                           tokenizer_dir=tok.path)
    replies: dict[str, str] = {}
    codes: dict[str, int] = {}
    for backend in backends:
        cmd = [sys.executable, "-m", "astrai_cli.main", "chat", str(ckpt), "--prompt",
               "The history of the", "--no-template", "--temperature", "0", "--max-tokens",
               str(max_tokens), "--device", device, "--dtype", dtype]
        if backend != "auto":  # auto: the engine's own choice
            cmd += ["--backend", backend]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)
        replies[backend], codes[backend] = res.stdout, res.returncode
        if res.returncode:
            replies[backend] += res.stderr[-400:]
    a, b = (replies[x] for x in backends)
    prefix = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return {"backends": list(backends), "device": device, "dtype": dtype,
            "max_tokens": max_tokens, "exit_codes": codes,
            "equal": a == b and not any(codes.values()), "common_prefix_chars": prefix,
            "replies": replies}


# -- driver ---------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> dict[str, Any]:
    dry = args.dry
    device = torch.device("cpu" if dry else "cuda")
    preset = "tiny" if dry else args.preset
    seq = 64 if dry else args.seq
    batch = 2 if dry else args.batch
    steps, warmup = (3, 1) if dry else (args.steps, args.warmup)
    precision = "bf16-mixed"  # on the CPU too: the same autocast path, at tiny shapes
    compile_mode = args.compile if not dry else ("block" if args.dry_compile else "none")
    out: dict[str, Any] = {"dry": dry, "targets": {"mfu": TARGET_MFU,
                                                   "decode_hbm_fraction_batch1":
                                                   TARGET_DECODE_HBM}, "skipped": []}
    out.update(ceilings(device))
    t_end = time.perf_counter() + args.budget

    def save() -> None:
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=2) + "\n")

    def left() -> float:
        return t_end - time.perf_counter()

    save()
    common = {"device": device, "precision": precision, "compile": compile_mode, "seq_len": seq,
              "batch": batch, "steps": steps, "warmup": warmup,
              "peak_tflops": out["peak_bf16_tflops"]}
    t0 = time.perf_counter()
    figures, model = train_figures(preset, checkpointing=False, **common)
    setup_s = time.perf_counter() - t0 - figures["step_s"] * figures["timed_steps"]
    out["train"] = figures
    print(_train_line(figures), flush=True)
    save()
    model = uncompiled_copy(model, torch.bfloat16)
    for b in (1, 32):
        if left() < 5:
            out["skipped"].append(f"decode_b{b}")
            continue
        d = decode_figures(model, batch=b, prompt_len=16 if dry else args.prompt_len,
                           new_tokens=8 if dry else args.new_tokens, backend=args.backend,
                           peak_hbm_gbs=out["peak_hbm_gbs"])
        out[f"decode_b{b}"] = d
        print(f"decode batch {b} ({d['backend']}): {d['tokens_per_s']:,.0f} tok/s, "
              f"{d['ms_per_step']:.2f} ms/step, {d['hbm_gbs']:,.0f} GB/s = "
              f"{d['hbm_fraction']:.1%} of {out['peak_hbm_gbs']:,.0f} GB/s", flush=True)
        save()
    del model
    gc.collect()  # the training run's optimizer and graphs, before the next allocations
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if left() < 10:
        out["skipped"].append("chat")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            c = chat_figures(Path(tmp), device=str(device), dtype="bfloat16",
                             backends=("torch_native", args.backend or "auto"),
                             max_tokens=16 if dry else 32)
        out["chat"] = c
        print(f"chat --prompt {c['backends'][1]} vs {c['backends'][0]}: "
              f"{'EQUAL' if c['equal'] else 'DIFFERENT'} (common prefix "
              f"{c['common_prefix_chars']} chars, exit codes {c['exit_codes']})", flush=True)
        save()
    # recomputation: ~1.5x the compile and ~1.4x the step time of the plain run (estimates)
    n = ckpt_steps(left() - 5, setup_s, figures["step_s"], steps, warmup)
    if n:
        figures, _ = train_figures(preset, checkpointing=True, **{**common, "steps": n})
        out["train_ckpt"] = figures
        print(_train_line(figures), flush=True)
    else:
        out["skipped"].append("train_ckpt")
    save()
    if out["skipped"]:
        print(f"skipped for lack of time: {', '.join(out['skipped'])}", flush=True)
    return out


def ckpt_steps(seconds: float, setup_s: float, step_s: float, steps: int, warmup: int) -> int:
    """Steps of the activation-checkpointing run that fit in `seconds`, given the plain run's
    setup (model, compile) and step time: all `steps`, fewer (at least warmup + 3), or 0."""
    fit = int((seconds - 1.5 * setup_s) / (1.4 * step_s)) if step_s > 0 else steps
    return min(steps, fit) if fit >= warmup + 3 else 0


def _train_line(f: dict[str, Any]) -> str:
    return (f"train {f['preset']} ({f['params'] / 1e6:,.0f}M) {f['precision']} compile="
            f"{f['compile']} act-ckpt={f['activation_checkpointing']} fused-adamw="
            f"{f['fused_adamw']} seq {f['seq_len']} x batch {f['batch']}: "
            f"{f['tokens_per_s']:,.0f} tok/s, MFU {f['mfu']:.1%} ({f['achieved_tflops']:.1f} "
            f"TFLOP/s), peak memory {f['peak_memory_gib']:.1f} GiB, step {f['step_s']:.3f} s, "
            f"compile/warm-up {f['compile_warmup_s']:.1f} s")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry", action="store_true", default=os.environ.get("GPU_E2E_DRY") == "1",
                    help="CPU, tiny preset, fp32 (default when GPU_E2E_DRY=1)")
    ap.add_argument("--dry-compile", action="store_true",
                    help="with --dry, also torch.compile the blocks (slow on a small CPU)")
    ap.add_argument("--preset", default="1.2b")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps, warm-up included")
    ap.add_argument("--warmup", type=int, default=5, help="first steps not timed (compile)")
    ap.add_argument("--compile", default="block", choices=["none", "block", "model"])
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--backend", default=None,
                    help="attention backend for decode and chat (default: cuda on CUDA, "
                         "the automatic choice in the dry run)")
    ap.add_argument("--budget", type=float, default=110.0,
                    help="seconds; later parts are skipped when less than ~10 s are left")
    ap.add_argument("--json", default=None, help="write every figure to this file")
    args = ap.parse_args(argv)
    if args.backend is None and not args.dry:
        args.backend = "cuda"
    if not args.dry and not torch.cuda.is_available():
        sys.exit("gpu_e2e: no CUDA device (GPU_E2E_DRY=1 runs the CPU dry run)")
    run(args)


if __name__ == "__main__":
    main()
