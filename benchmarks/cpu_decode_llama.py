"""llama.cpp measured by its own tools on a GGUF: `llama-bench` (pp512 and tg128, one
sequence) and `llama-batched-bench` (4 sequences of 512 prompt tokens then 128 generated
together), each a fresh process per measurement, JSON out, llama.cpp's defaults otherwise
(its load mode: mmap of the file; its warm-up run, its KV cache type, its weight
repacking)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from cpu_decode_astrai import CONCURRENT, PP, TG, Figures


class PeerError(RuntimeError):
    """A llama.cpp tool that crashed or printed no figures: the row is BROKEN."""


def _tail(r: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in (r.stderr + r.stdout).splitlines() if ln.strip()]
    return lines[-1][:160] if lines else "(no output)"


def _call(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise PeerError(f"{Path(cmd[0]).name} ran past {timeout:.0f} s") from None
    if r.returncode != 0:
        raise PeerError(f"{Path(cmd[0]).name} exited with {r.returncode}: {_tail(r)}")
    return r


def bench(binary: Path, gguf: Path, threads: int, pp: bool = True,
          timeout: float = 600) -> tuple[Figures, dict]:
    """(pp512 and tg128 of one sequence, llama-bench's first JSON record: its conditions)."""
    cmd = [str(binary), "-m", str(gguf), "-t", str(threads), "-r", "1", "-o", "json",
           "-p", str(PP if pp else 0), "-n", str(TG)]
    r = _call(cmd, timeout)
    try:
        rows = json.loads(r.stdout)
    except json.JSONDecodeError:
        raise PeerError(f"llama-bench printed no JSON: {_tail(r)}") from None
    fig = Figures()
    for row in rows:
        if row.get("n_prompt") == PP and row.get("n_gen") == 0:
            fig.pp = float(row["avg_ts"])
        elif row.get("n_gen") == TG and row.get("n_prompt") == 0:
            fig.tg = float(row["avg_ts"])
    if fig.tg is None or (pp and fig.pp is None):
        raise PeerError(f"llama-bench gave no pp{PP}/tg{TG} record: {_tail(r)}")
    return fig, (rows[0] if rows else {})


def batched(binary: Path, gguf: Path, threads: int, timeout: float = 600) -> Figures:
    """pp and tg tokens/s of 4 sequences (512 prompt tokens each, not shared; then 128
    tokens each, decoded together)."""
    ctx = CONCURRENT * (PP + TG)
    cmd = [str(binary), "-m", str(gguf), "-t", str(threads), "-tb", str(threads),
           "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", str(PP), "-ntg", str(TG),
           "-npl", str(CONCURRENT), "--output-format", "jsonl"]
    r = _call(cmd, timeout)
    for line in (r.stdout + "\n" + r.stderr).splitlines():
        if line.startswith('{"n_kv_max"'):
            row = json.loads(line)
            return Figures(float(row["speed_pp"]), float(row["speed_tg"]))
    raise PeerError(f"llama-batched-bench printed no JSON line: {_tail(r)}")


def conditions(row: dict) -> str:
    """llama-bench's record of how it ran (the fields a reader needs beside a figure)."""
    keys = ("build_commit", "build_number", "cpu_info", "backends", "n_threads", "poll",
            "type_k", "type_v", "n_batch", "n_ubatch", "flash_attn", "load_mode", "repack")
    return ", ".join(f"{k}={row[k]}" for k in keys if k in row)
