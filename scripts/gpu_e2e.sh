#!/usr/bin/env bash
# Training MFU, decode HBM bandwidth and chat on the cuda backend, on one GPU, in ~110 s;
# called by scripts/gpu_check.sh (which appends this output to $OUT/e2e.log). The figures
# land in $OUT/e2e.json; the measuring is benchmarks/gpu_e2e.py (docs/benchmarks.md).
#
#   OUT=/some/dir bash scripts/gpu_e2e.sh              (a CUDA machine: the 1.2b preset)
#   GPU_E2E_DRY=1 OUT=/tmp/x bash scripts/gpu_e2e.sh   (CPU, tiny preset: the same code paths)
#
# GPU_E2E_BUDGET (seconds, default 110): later parts are skipped when the time runs short.
# GPU_E2E_ARGS: extra arguments, e.g. "--preset 125m --batch 16" when 1.2b does not fit.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
# shellcheck disable=SC2086  # GPU_E2E_ARGS is a list of arguments
exec "${PYTHON:-python3}" benchmarks/gpu_e2e.py --json "$OUT/e2e.json" \
  --budget "${GPU_E2E_BUDGET:-110}" ${GPU_E2E_ARGS:-}
