"""Synthetic records with verifiable answers: chat (sft), preference pairs (dpo), prompts
with reference answers or scored response groups (grpo).

Tasks are small arithmetic and string problems whose answer is computed, so a reward can be
checked by rule. Train and held-out splits never share a question. Deterministic per seed.

    python -m astrai.data.synthetic --out examples/data --n 1000 --n-val 100
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterator
from pathlib import Path

WORDS = ("castle", "river", "garden", "lantern", "winter", "forest", "harbor", "candle",
         "meadow", "silver", "thunder", "orchard", "pepper", "violet", "marble", "falcon",
         "crimson", "shadow", "whisper", "breeze", "ember", "copper", "velvet", "summit")
SYSTEM = "You are a careful assistant. Answer with the result only."


def _task(rng: random.Random) -> tuple[str, str]:
    """(question, answer) of one random task."""
    kind = rng.randrange(6)
    if kind == 0:
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        return f"What is {a} + {b}?", str(a + b)
    if kind == 1:
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        return f"What is {a} - {b}?", str(a - b)
    if kind == 2:
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        return f"What is {a} * {b}?", str(a * b)
    w = rng.choice(WORDS)
    if kind == 3:
        return f"Reverse the word '{w}'.", w[::-1]
    if kind == 4:
        return f"Write '{w}' in capital letters.", w.upper()
    return f"How many letters are in '{w}'?", str(len(w))


def _wrong(answer: str, rng: random.Random) -> str:
    """A plausible wrong answer (for rejected responses and low-reward samples)."""
    if answer.lstrip("-").isdigit():
        return str(int(answer) + rng.choice((-10, -2, -1, 1, 2, 10)))
    chars = list(answer)
    i = rng.randrange(len(chars))
    chars[i] = "x" if chars[i] != "x" else "y"
    return "".join(chars) if len(chars) > 1 else answer + answer


def tasks(n: int, seed: int, exclude: set[str] | None = None) -> Iterator[tuple[str, str]]:
    """`n` distinct (question, answer) pairs, none of whose questions is in `exclude`."""
    rng = random.Random(seed)
    seen = set(exclude or ())
    made = 0
    for _ in range(n * 200):
        q, a = _task(rng)
        if q in seen:
            continue
        seen.add(q)
        made += 1
        yield q, a
        if made == n:
            return
    raise ValueError(f"only {made} distinct tasks exist; ask for fewer")


def chat_record(q: str, a: str, rng: random.Random) -> dict:
    msgs = [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    if rng.random() < 0.3:
        msgs.insert(0, {"role": "system", "content": SYSTEM})
    if rng.random() < 0.2:  # a second turn, so multi-turn masking is exercised
        q2, a2 = _task(rng)
        msgs += [{"role": "user", "content": q2}, {"role": "assistant", "content": a2}]
    return {"messages": msgs}


def preference_record(q: str, a: str, rng: random.Random) -> dict:
    return {"prompt": q, "chosen": a, "rejected": _wrong(a, rng)}


def prompt_record(q: str, a: str) -> dict:
    return {"prompt": q, "reference": a}


def group_record(q: str, a: str, rng: random.Random, group: int = 4) -> dict:
    """Offline GRPO: `group` responses with rule rewards (1 correct, 0 wrong)."""
    responses = [a if rng.random() < 0.5 else _wrong(a, rng) for _ in range(group)]
    return {"prompt": q, "responses": responses,
            "rewards": [1.0 if r == a else 0.0 for r in responses]}


def _make(name: str, q: str, a: str, rng: random.Random, group: int) -> dict:
    if name == "sft":
        return chat_record(q, a, rng)
    if name == "dpo":
        return preference_record(q, a, rng)
    if name == "grpo":
        return prompt_record(q, a)
    return group_record(q, a, rng, group)


def write_all(out: str | Path, n: int = 1000, n_val: int = 100, seed: int = 0,
              group: int = 4) -> dict[str, Path]:
    """Write {sft,dpo,grpo,grpo_offline}_{train,val}.jsonl into `out`; return the paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    val = list(tasks(n_val, seed + 1))
    train = list(tasks(n, seed, exclude={q for q, _ in val}))
    paths: dict[str, Path] = {}
    for split, items in (("train", train), ("val", val)):
        for name in ("sft", "dpo", "grpo", "grpo_offline"):
            rng = random.Random(f"{seed}-{split}-{name}")
            p = paths[f"{name}_{split}"] = out / f"{name}_{split}.jsonl"
            with open(p, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(_make(name, q, a, rng, group), ensure_ascii=False) + "\n"
                             for q, a in items)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="examples/data")
    ap.add_argument("--n", type=int, default=1000, help="training records per kind")
    ap.add_argument("--n-val", type=int, default=100, help="held-out records per kind")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for p in write_all(args.out, args.n, args.n_val, args.seed).values():
        print(p)


if __name__ == "__main__":
    main()
