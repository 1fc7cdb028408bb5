"""Fixtures other rooms' tests use: a tiny trained tokenizer and tiny datasets."""

from __future__ import annotations

from pathlib import Path

from astrai.data.assets import tiny_corpus_path
from astrai.data.tokenizer import Tokenizer

__all__ = ["tiny_corpus_path", "tiny_dataset", "tiny_tokenizer"]


def tiny_tokenizer(tmp_path: str | Path, vocab_size: int = 512) -> Tokenizer:
    """Train (well under a second) a byte-level BPE tokenizer on the bundled corpus.

    Saved in `tmp_path/tokenizer-<vocab_size>` (reused when already there); the result's
    `.path` is that directory. Special tokens: <|bos|>, <|endoftext|> (eos), <|pad|>,
    <|im_start|>, <|im_end|>; the default ChatML-style template.
    """
    from astrai.data.bpe import train_tokenizer

    out = Path(tmp_path) / f"tokenizer-{vocab_size}"
    if (out / "tokenizer.json").is_file():
        return Tokenizer.load(out)
    train_tokenizer([tiny_corpus_path()], vocab_size, out)
    return Tokenizer.load(out)


def tiny_dataset(tmp_path: str | Path, kind: str = "pretrain", *, vocab_size: int = 512,
                 fmt: str = "h5", max_seq_len: int = 128, n: int = 64, n_val: int = 16,
                 offline: bool = False, **spec: object) -> Path:
    """Build a small dataset of `kind` in `tmp_path` (with a val split); return its directory.

    pretrain uses the bundled corpus (one record per paragraph); sft, dpo and grpo use the
    synthetic task records (`astrai.data.synthetic`; offline=True gives grpo groups of 4).
    Extra keyword arguments go into the spec (e.g. packing={"mode": "bfd"}).
    """
    import json

    from astrai.config.preprocess import load_spec
    from astrai.data.builder import build_dataset
    from astrai.data.synthetic import write_all

    tmp = Path(tmp_path)
    tok = tiny_tokenizer(tmp, vocab_size)
    raw = tmp / f"raw-{kind}"
    raw.mkdir(parents=True, exist_ok=True)
    if kind == "pretrain":
        paras = [p for p in tiny_corpus_path().read_text(encoding="utf-8").split("\n\n")
                 if len(p) >= 50]
        for name, part in (("train", paras[n_val:n_val + n]), ("val", paras[:n_val])):
            with open(raw / f"{name}.jsonl", "w", encoding="utf-8") as f:
                f.writelines(json.dumps({"text": p}) + "\n" for p in part)
        train, val = raw / "train.jsonl", raw / "val.jsonl"
    else:
        paths = write_all(raw, n=n, n_val=n_val)
        name = "grpo_offline" if kind == "grpo" and offline else kind
        train, val = paths[f"{name}_train"], paths[f"{name}_val"]
    out = tmp / f"data-{kind}{'-offline' if offline else ''}-{fmt}-{max_seq_len}"
    data = {"kind": kind, "inputs": [str(train)], "val_inputs": [str(val)],
            "tokenizer": str(tok.path), "output": str(out), "format": fmt,
            "max_seq_len": max_seq_len, "overwrite": True, **spec}
    build_dataset(load_spec(data=data))
    return Path(str(data["output"]))
