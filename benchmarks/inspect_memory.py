"""Peak memory of `inspect_weights` on a synthetic multi-GB checkpoint.

Target: peak RSS < 2 x the largest tensor + 500 MB, however large the file. The peer is the
naive way — load the whole safetensors file (`safetensors.torch.load_file`, what a
`read_safetensors`-based scan would do) — measured in the same run; the ratio is printed.

The file is written tensor by tensor in the safetensors layout (8-byte header length, JSON
header, raw little-endian data), so writing it needs no more memory than one chunk. Lock-in
(LM-head rows at exactly 1.0), overflow (2e37) and a NaN (embedding) are planted in the largest
tensors so every analysis pass runs. Each measurement runs in a fresh process (ru_maxrss of that process).

Measured on the 2-core dev machine (load ~9), 3 GB file, largest tensor 954 MiB, budget
2407 MiB: inspect-weights peak RSS 417 MiB (0.17 of budget; ~400 MiB of it is python + torch),
66 s CPU; two-checkpoint diff 422 MiB; the peer 14,066 MiB (33.8x ours) — it needs several
times the file size in RAM, so pass --no-peer on small machines.

    python benchmarks/inspect_memory.py --gb 3            # ~3 GB file in $TMPDIR, removed after
    python benchmarks/inspect_memory.py --gb 3 --diff     # also two checkpoints (stuck diff)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

_CHILD = r"""
import json, resource, sys, time
import torch
from safetensors.torch import load_file
from astrai.inspect import inspect_weights
t0 = time.perf_counter()  # imports (python + torch + astrai: ~400 MB RSS) not timed
mode, paths = sys.argv[1], sys.argv[2:]
if mode == "inspect":
    r = inspect_weights(paths)
    s = r.scans[0]
    out = {"verdict": r.verdict, "locked": s.locked, "overflow": s.overflowed,
           "nonfinite": s.nonfinite, "stuck": r.stuck.stuck if r.stuck else None}
else:  # the naive scan: load the whole file, then per-tensor statistics in fp32
    stats = {}
    for name, w in load_file(paths[0]).items():
        x = w.float()
        fin = torch.isfinite(x)
        stats[name] = (float(x[fin].mean()), float(x[fin].std()), float(x.min()),
                       float(x.max()), int((~fin).sum()))
    out = {"tensors": len(stats)}
out["seconds"] = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_SELF)
out["cpu_seconds"] = ru.ru_utime + ru.ru_stime
out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps(out))
"""


def plan(total_bytes: int) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """A Llama-like layout: a bf16 embedding and head of ~1/3 each, fp32 blocks for the rest."""
    dim = 2048
    vocab = max(1024, int(total_bytes / 3 / (dim * 2)))
    tensors = [("embed_tokens.weight", (vocab, dim), torch.bfloat16),
               ("lm_head.weight", (vocab, dim), torch.bfloat16)]
    left = total_bytes - 2 * vocab * dim * 2
    per_layer = 4096 * dim * 4 + dim * 4
    for i in range(max(1, left // per_layer)):
        tensors.append((f"layers.{i}.mlp.up_proj.weight", (4096, dim), torch.float32))
        tensors.append((f"layers.{i}.mlp_norm.weight", (dim,), torch.float32))
    return tensors


_ST = {torch.float32: "F32", torch.bfloat16: "BF16"}


def write_file(path: Path, tensors, seed: int, shift: float = 0.0) -> None:
    """Stream a safetensors file: random N(0, 0.02) data, planted damage in the embedding."""
    header, offset = {}, 0
    for name, shape, dtype in tensors:
        n = 1
        for s in shape:
            n *= s
        nbytes = n * torch.empty(0, dtype=dtype).element_size()
        header[name] = {"dtype": _ST[dtype], "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    g = torch.Generator().manual_seed(seed)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for name, shape, dtype in tensors:
            rows = shape[0]
            cols = 1 if len(shape) == 1 else shape[1]
            step = max(1, (1 << 24) // cols)
            for a in range(0, rows, step):
                b = min(rows, a + step)
                if len(shape) == 1:
                    x = torch.ones(b - a)
                else:
                    x = torch.randn(b - a, cols, generator=g) * 0.02 + shift
                if name == "embed_tokens.weight" and a == 0:
                    x[0:4, :40] = 2e37  # overflowed token rows
                    x[10, 3] = float("nan")
                if name == "lm_head.weight" and a == 0:
                    x[6:8] = 1.0  # locked rows (in both files: stuck across checkpoints)
                f.write(x.to(dtype).contiguous().view(torch.uint8).numpy().tobytes())


def measure(mode: str, paths: list[Path]) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, mode, *map(str, paths)],
                         check=False, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{mode} run failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=3.0, help="file size in GB (default 3)")
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    ap.add_argument("--diff", action="store_true", help="also measure a two-checkpoint diff")
    ap.add_argument("--no-peer", action="store_true", help="skip the whole-file load")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="astrai-inspect-mem-", dir=args.dir))
    try:
        tensors = plan(int(args.gb * 1e9))
        a = work / "a.safetensors"
        t0 = time.perf_counter()
        write_file(a, tensors, seed=0)
        size = a.stat().st_size
        largest = max(
            (torch.empty(0, dtype=d).element_size() * torch.Size(s).numel() for _, s, d in tensors))
        budget = 2 * largest + 500 * 2**20
        print(f"file {size / 1e9:.2f} GB, {len(tensors)} tensors, largest "
              f"{largest / 2**20:.0f} MiB (written in {time.perf_counter() - t0:.0f} s)")
        print(f"budget: 2 x largest + 500 MiB = {budget / 2**20:.0f} MiB")
        r = measure("inspect", [a])
        ok = r["peak_rss"] < budget
        print(f"inspect-weights: peak RSS {r['peak_rss'] / 2**20:.0f} MiB "
              f"({r['peak_rss'] / budget:.2f} of budget, {'PASS' if ok else 'FAIL'}), "
              f"{r['seconds']:.1f} s wall, {r['cpu_seconds']:.1f} s CPU incl. imports "
              f"({size / 1e9 / r['seconds']:.2f} GB/s wall); "
              f"verdict {r['verdict']}, locked {r['locked']}, overflow {r['overflow']}, "
              f"non-finite {r['nonfinite']}")
        if not args.no_peer:
            p = measure("load", [a])
            print(f"peer (load_file + fp32 stats per tensor): peak RSS {p['peak_rss'] / 2**20:.0f} MiB, "
                  f"{p['seconds']:.1f} s wall, {p['cpu_seconds']:.1f} s CPU; ratio peer / ours = {p['peak_rss'] / r['peak_rss']:.2f}x")
        if args.diff:
            b = work / "b.safetensors"
            write_file(b, tensors, seed=0, shift=1e-3)
            d = measure("inspect", [a, b])
            ok2 = d["peak_rss"] < budget
            print(f"two-checkpoint diff: peak RSS {d['peak_rss'] / 2**20:.0f} MiB "
                  f"({d['peak_rss'] / budget:.2f} of budget, {'PASS' if ok2 else 'FAIL'}), "
                  f"{d['seconds']:.1f} s wall, {d['cpu_seconds']:.1f} s CPU, stuck {d['stuck']}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    main()
