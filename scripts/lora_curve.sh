#!/usr/bin/env bash
# Validation-loss curves of LoRA vs full fine-tuning (SFT) on the bundled examples/data chat
# set, as recorded in docs/lora.md ("LoRA vs full fine-tuning").
#
#   scripts/lora_curve.sh [OUT_DIR]          (default runs/lora_curve; CPU)
#
# Environment: ARMS ("full:1e-3 lora:3e-3 lora:1e-2": method:peak-lr, run in order),
# STEPS (150), EVAL (25), RANK (8), BASE_STEPS (400: quickstart steps of the base model),
# THREADS (1). The base and the tokenized data are made once and reused on a rerun.
# Prints markdown tables: val_loss at step 0 (the base) and every EVAL steps per arm;
# trainable parameters, median step time and wall time per arm; the final val_loss split
# into the end-of-turn token <|im_end|> and the answer's other tokens.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-runs/lora_curve}
ARMS=${ARMS:-full:1e-3 lora:3e-3 lora:1e-2}
STEPS=${STEPS:-150}; EVAL=${EVAL:-25}; RANK=${RANK:-8}; BASE_STEPS=${BASE_STEPS:-400}
THREADS=${THREADS:-1}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# 1. the base: quickstart's 2-layer model (tiny preset) pre-trained on the bundled
#    Shakespeare corpus, a fixed number of steps (reproducible anywhere), with the AdamW
#    recipe the recorded curves used (the quickstart's default is now Muon + QK-norm)
if [ ! -d "$OUT/qs/run/checkpoints" ]; then
    astrai quickstart --out "$OUT/qs" --steps "$BASE_STEPS" --threads "$THREADS" \
        --device cpu --overwrite --optimizer adamw --weight-decay 0.1 \
        --model-overrides qk_norm=false > "$OUT/qs.log" 2>&1
fi
CK=$(ls -d "$OUT"/qs/run/checkpoints/step_* | sort -t_ -k2 -n | tail -1)

# 2. the SFT set (examples/specs/sft.json's recipe), tokenized with the base's tokenizer and
#    the ChatML template (loss on the assistant turns only)
if [ ! -f "$OUT/sft-data/manifest.json" ]; then
    cat > "$OUT/sft.json" <<JSON
{"kind": "sft", "inputs": ["$REPO/examples/data/sft_train.jsonl"],
 "val_inputs": ["$REPO/examples/data/sft_val.jsonl"], "tokenizer": "$CK",
 "output": "$OUT/sft-data", "chat_template": "chatml",
 "sections": [{"field": "messages", "action": "\$role", "template": true}],
 "roles": {"system": "mask", "user": "mask", "assistant": "train"},
 "max_seq_len": 256, "truncation": "right", "packing": {"mode": "none"}, "format": "h5"}
JSON
    astrai preprocess "$OUT/sft.json" --workers 1 > "$OUT/pre.log" 2>&1
fi

# 3. step 0: the base's loss on the validation split (the same masked token mean as val_loss)
astrai eval "$CK" --data "$OUT/sft-data" --device cpu --threads "$THREADS" \
    --out "$OUT/base_eval.json" > /dev/null

# 4. the arms: same data order, schedule, batch and evaluation; only method and peak lr differ
COMMON=(--strategy sft --data "$OUT/sft-data" --model "$CK" --batch-size 8
        --max-steps "$STEPS" --eval-interval "$EVAL" --warmup-steps 10 --device cpu
        --threads "$THREADS" --ckpt-interval 0 --json)
names=()
for arm in $ARMS; do
    method=${arm%%:*}; lr=${arm#*:}; name="${method}_lr$lr"
    case $method in
        full) extra=() ;;
        lora) extra=(--lora-rank "$RANK") ;;
        *) echo "ARMS: unknown method '$method' (full or lora)" >&2; exit 2 ;;
    esac
    astrai train "${COMMON[@]}" "${extra[@]}" --dry-run > "$OUT/$name.plan.json"
    rm -rf "${OUT:?}/$name"
    astrai train "${COMMON[@]}" "${extra[@]}" --max-lr "$lr" --out "$OUT/$name" \
        > "$OUT/$name.json" 2> "$OUT/$name.err"
    names+=("$name")
done

# 5. the table
python - "$OUT" "$CK" "${names[@]}" <<'PY'
import json, math, statistics, sys
from pathlib import Path

import torch
import torch.nn.functional as F

from astrai.data.dataset import open_dataset
from astrai.data.tokenizer import Tokenizer
from astrai.infer.loading import load_model

out, base_ck, names = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
base = math.log(json.loads((out / "base_eval.json").read_text())["ppl"])
cols, rows = {}, {}
for name in names:
    recs = [json.loads(line) for line in open(out / name / "metrics.jsonl")]
    plan = json.loads((out / f"{name}.plan.json").read_text())
    summary = json.loads((out / f"{name}.json").read_text())
    cols[name] = {0: base, **{r["step"]: r["val_loss"] for r in recs if "val_loss" in r}}
    step_s = statistics.median(r["tokens"] / r["tokens_per_s"] for r in recs)
    rows[name] = (plan["trainable_params"] or plan["params"], plan["params"], step_s,
                  summary["elapsed_s"])
print("| step | " + " | ".join(names) + " |")
print("|---|" + "---|" * len(names))
for step in sorted(set().union(*cols.values())):
    print(f"| {step} | " + " | ".join(f"{cols[n].get(step, float('nan')):.3f}"
                                      for n in names) + " |")
print()
print("| arm | trainable parameters | median step time | run wall time (evals included) |")
print("|---|---|---|---|")
for n, (tr, total, step_s, wall) in rows.items():
    print(f"| {n} | {tr:,} ({tr / total:.1%}) | {step_s * 1e3:.0f} ms | {wall:.1f} s |")

# the final val_loss by target token: <|im_end|> (a special token pre-training never saw)
# vs the answers' other tokens
torch.set_num_threads(1)
end = Tokenizer.load(base_ck).token_to_id("<|im_end|>")
val = open_dataset(out / "sft-data", "val")
batch = val.collate([val[i] for i in range(len(val))])
targets = batch["target_ids"].clone()
if "loss_mask" in batch:
    targets[batch["loss_mask"] == 0] = -100
targets = targets.flatten()
scored = targets != -100
print()
print("| model | val_loss | on <\\|im_end\\|> | on the other answer tokens |")
print("|---|---|---|---|")
for n, ck in [("base", base_ck)] + [(n, out / n / "checkpoints" / f"step_{max(cols[n])}")
                                    for n in names]:
    with torch.no_grad():
        logits = load_model(ck, device="cpu")(batch["input_ids"]).logits
    nll = F.cross_entropy(logits.flatten(0, 1), targets, ignore_index=-100, reduction="none")
    parts = [scored, scored & (targets == end), scored & (targets != end)]
    print(f"| {n} | " + " | ".join(f"{nll[m].mean():.3f} ({int(m.sum())} tokens)"
                                   for m in parts) + " |")
PY
