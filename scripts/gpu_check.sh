#!/usr/bin/env bash
# One prepared run for a lent GPU: build the CUDA kernels with the machine's nvcc,
# run the GPU tests, the kernel benchmarks and short end-to-end checks, and write a summary.
# It keeps going past failures; each step's exit code and time land in $OUT/summary.txt.
#
#   OUT=/some/dir bash scripts/gpu_check.sh          (the device tool sets OUT itself)
#
# Budget: GPU_CHECK_BUDGET seconds in all (default 285); a step starts only while time is
# left and gets at most what remains; the steps before scripts/gpu_e2e.sh leave it
# GPU_E2E_RESERVE seconds (default 115). At most 8 files come back from $OUT, so logs are
# merged: summary.txt, build.log (the environment first), tests.log, bench.log, bench.json,
# e2e.log, serve.json, e2e.json.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
BUDGET=${GPU_CHECK_BUDGET:-285}
RESERVE=0  # seconds a step leaves for the steps after it (set before the steps below)
START=$(date +%s)
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
export PYTHONUNBUFFERED=1
export ASTRAI_KERNELS_CACHE=${ASTRAI_KERNELS_CACHE:-/tmp/astrai-kernels}
PY=${PYTHON:-python3}

# Packages the GPU image lacks (pydantic & co.) travel as wheels in .whl (device README).
if compgen -G ".whl/*.whl" > /dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl > "$OUT/build.log" 2>&1 || echo "wheel install failed" >> "$SUMMARY"
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
ASTRAI="$PY -m astrai_cli.main"

# seconds left of the whole budget
left_now() { echo $((BUDGET - ($(date +%s) - START))); }

# step NAME CAP_SECONDS LOGFILE CMD...: run CMD under the remaining budget, log, record.
step() {
  local name=$1 cap=$2 log=$3
  shift 3
  local now left rc t0
  now=$(date +%s)
  left=$((BUDGET - (now - START) - RESERVE))
  if [ "$left" -lt 10 ]; then
    printf '%-28s SKIPPED (budget spent)\n' "$name" >> "$SUMMARY"
    return
  fi
  [ "$cap" -gt "$left" ] && cap=$left
  t0=$(date +%s)
  echo "===== $name ($*)" >> "$OUT/$log"
  timeout --kill-after=5 "$cap" "$@" >> "$OUT/$log" 2>&1
  rc=$?
  local status=ok
  [ "$rc" -ne 0 ] && status="FAILED rc=$rc"
  [ "$rc" -eq 124 ] && status="TIMEOUT after ${cap}s"
  printf '%-28s %-22s %4ss  (%s)\n' "$name" "$status" "$(( $(date +%s) - t0 ))" "$log" >> "$SUMMARY"
}

{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
  nvcc --version | tail -2
  $PY -c "import torch, sys; print(sys.version.split()[0], 'torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))"
  $PY -c "import pydantic, typer, rich; print('pydantic', pydantic.VERSION, 'typer', typer.__version__)"
} >> "$OUT/build.log" 2>&1

# 1. Build with this machine's nvcc (sm_80 + sm_90, PTX of sm_90), then report.
step "build kernels (nvcc)" 180 build.log $PY -m astrai.kernels.build
step "astrai kernels" 30 build.log $ASTRAI kernels
# From here on, keep time for the training / decode / chat figures of scripts/gpu_e2e.sh.
[ -f scripts/gpu_e2e.sh ] && RESERVE=${GPU_E2E_RESERVE:-115}

# 2. The kernels' GPU tests, then every other room's GPU tests.
step "pytest kernels -m gpu" 170 tests.log $PY -m pytest tests/kernels -m gpu -q -rfEs \
  -p no:cacheprovider --durations=10
# DCP checkpoints on CUDA: fsdp with async saves (CUDA -> host staging), resume, export.
step "DCP save/async/resume/export" 45 tests.log $PY -m pytest tests/train/test_dcp_checkpoints.py \
  -m gpu -q -rfEs -p no:cacheprovider
step "pytest (other rooms) -m gpu" 60 tests.log $PY -m pytest tests -m gpu -q -rfEs \
  -p no:cacheprovider --ignore=tests/kernels --ignore=tests/train/test_dcp_checkpoints.py

# 3. Kernel benchmarks (ratios against torch and, when importable, flash-attn).
step "benchmarks/cuda_kernels.py" 100 bench.log $PY benchmarks/cuda_kernels.py --json "$OUT/bench.json"

# 4. End to end: serving the small preset with the cuda backend against torch_native.
step "serve-bench cuda vs native" 60 e2e.log $ASTRAI serve-bench small --device cuda \
  --dtype bfloat16 --compare-backends cuda,torch_native -n 48 --input-len 128:512 \
  --output-len 64 --max-concurrency 16 --json "$OUT/serve.json"
# 5. Decode tokens/s at batch 1 and 32: eager, static shapes, CUDA graphs (same tokens).
step "decode: eager/static/graphs" 60 e2e.log $PY benchmarks/inference.py --presets small \
  --only d --device cuda --dtype bfloat16 --repeat 2
# The training and chat checks belong to the train/infer rooms: they go in scripts/gpu_e2e.sh
# (run with OUT set; anything it writes should be appended to $OUT/e2e.log), when it exists.
if [ -f scripts/gpu_e2e.sh ]; then
  RESERVE=0
  # its own budget ends a few seconds before the step's cap, so its JSON is complete
  step "scripts/gpu_e2e.sh" 120 e2e.log env GPU_E2E_BUDGET=$(( $(left_now) < 120 ? $(left_now) - 10 : 110 )) OUT="$OUT" bash scripts/gpu_e2e.sh
else
  printf '%-28s SKIPPED (no scripts/gpu_e2e.sh)\n' "train / chat" >> "$SUMMARY"
fi

printf '\ntotal %ss of %ss budget\n' "$(( $(date +%s) - START ))" "$BUDGET" >> "$SUMMARY"
# The reply carries the end of the output: the figures, then the summary last.
echo "----- tests (tail)"; grep -E "passed|failed|error|FAILED|ERROR" "$OUT/tests.log" | tail -15
echo "----- bench"; cat "$OUT/bench.log" 2>/dev/null | grep -v "^=====" | tail -40
echo "----- e2e (tail)"; tail -25 "$OUT/e2e.log" 2>/dev/null
[ -f "$OUT/e2e.json" ] && echo "(figures: e2e.json)"
echo "----- summary"; cat "$SUMMARY"
