"""A tiny HF Llama and two PEFT LoRA adapters on it (different ranks and targets), made with
transformers and peft themselves, for the multi-LoRA tests of the engine and the server.

Weights are drawn large (std 0.2) so the logits are peaked, and the adapters' B matrices
are scaled up so each adapter changes the greedy tokens clearly: a merged or unmerged
update, or another summation order, cannot flip a token.
"""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 97
ADAPTERS = {
    # name: (rank, alpha, targets, rslora)
    "sql": (4, 8.0, ["q_proj", "v_proj", "down_proj"], False),
    "poet": (8, 8.0, ["k_proj", "o_proj", "gate_proj", "up_proj"], True),
}


def tiny_llama(root: Path, tokenizer_dir: Path | None = None) -> Path:
    """A random 2-layer HF Llama (hidden 64) saved in root/base (with tokenizer files from
    `tokenizer_dir` when given)."""
    import shutil

    import transformers

    out = root / "base"
    if (out / "config.json").is_file():
        return out
    vocab = VOCAB
    if tokenizer_dir is not None:
        from astrai.data.tokenizer import Tokenizer

        vocab = Tokenizer.load(tokenizer_dir).vocab_size
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=512,
                                   tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2) if p.dim() > 1 else p.fill_(1.0)
    model.save_pretrained(out)
    if tokenizer_dir is not None:
        for f in Path(tokenizer_dir).iterdir():
            if f.is_file() and f.name != "config.json":
                shutil.copy2(f, out / f.name)
    return out


def peft_adapter(base_dir: Path, out: Path, rank: int, alpha: float, targets: list[str],
                 rslora: bool, seed: int) -> Path:
    """A PEFT LoRA adapter on `base_dir` with random A and large random B."""
    import peft
    import transformers

    if (out / "adapter_config.json").is_file():
        return out
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    cfg = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets,
                          use_rslora=rslora, lora_dropout=0.0, task_type="CAUSAL_LM")
    model = peft.get_peft_model(base, cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            elif "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    model.save_pretrained(out)
    return out


def make_adapters(root: Path, base_dir: Path) -> dict[str, Path]:
    return {name: peft_adapter(base_dir, root / name, r, a, t, rs, seed=i + 1)
            for i, (name, (r, a, t, rs)) in enumerate(ADAPTERS.items())}


def peft_greedy(base_dir: Path, adapter: Path | None, prompt: list[int], n: int
                ) -> tuple[list[int], float]:
    """transformers' greedy tokens of the base or base + PEFT adapter (unmerged), and the
    smallest top-2 logit gap over the steps."""
    import peft
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    if adapter is not None:
        model = peft.PeftModel.from_pretrained(model, adapter)
    model.eval()
    with torch.no_grad():
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                             do_sample=False,
                             output_scores=True, return_dict_in_generate=True,
                             pad_token_id=0, eos_token_id=None)
    gaps = [float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in out.scores]
    return out.sequences[0, len(prompt):].tolist(), min(gaps)


def broken_adapters(root: Path, good: Path) -> dict[str, tuple[Path, str]]:
    """Copies of the adapter `good`, each broken one way an attacker or a bad export might:
    name -> (directory, a phrase the one-line error must hold)."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    def copy(name: str, config: dict | None = None, text: str | bytes | None = None,
             tensors=None) -> Path:
        out = root / name
        if out.exists():
            return out
        shutil.copytree(good, out)
        conf = out / "adapter_config.json"
        if config is not None:
            conf.write_text(json.dumps({**json.loads(conf.read_text()), **config}))
        if text is not None:
            conf.write_bytes(text if isinstance(text, bytes) else text.encode())
        if tensors is not None:
            weights = out / "adapter_model.safetensors"
            save_file({k: tensors(k, v).contiguous() for k, v in load_file(weights).items()},
                      weights)
        return out

    def nan_one(k, v):
        v = v.clone()
        if ".lora_B." in k:
            v[0, 0] = float("nan")
        return v

    conf = json.loads((good / "adapter_config.json").read_text())
    alpha_token = json.dumps({**conf, "lora_alpha": 0}).replace('"lora_alpha": 0',
                                                                '"lora_alpha": Infinity')
    return {
        "r0": (copy("r0", {"r": 0}, tensors=lambda k, v: v[:0] if ".lora_A." in k
                    else v[:, :0]), "r: 0"),
        "r-text": (copy("r-text", {"r": "abc"}), "r: 'abc'"),
        "r-null": (copy("r-null", {"r": None}), "r: None"),
        "r-list": (copy("r-list", {"r": [8]}), "r: [8]"),
        "r-frac": (copy("r-frac", {"r": 8.7}), "r: 8.7"),
        "alpha-text": (copy("alpha-text", {"lora_alpha": "x"}), "lora_alpha: 'x'"),
        "alpha-inf": (copy("alpha-inf", text=alpha_token), "lora_alpha: inf"),
        "targets-int": (copy("targets-int", {"target_modules": 5}), "target_modules: 5"),
        "not-utf8": (copy("not-utf8", text=b'{"r": "\xff\xfe"}'), "unreadable"),
        "deep": (copy("deep", text='{"r": ' + "[" * 100_000 + "]" * 100_000 + "}"),
                 "nested too deeply"),
        "nan-weight": (copy("nan-weight", tensors=nan_one), "holds NaN or Inf"),
    }
