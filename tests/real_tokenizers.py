"""Real model families' tokenizer files for interop tests, unpacked from tests/fixtures.

tests/fixtures/tokenizers holds Qwen3's and Mistral-7B-v0.1's unmodified files (Apache-2.0),
a Llama-3-style tokenizer built by make_llama3_style.py there and its Llama-3.1 twin with
3.1's tool-aware template (make_llama31_style.py); tokenizer.json is xz-compressed. A family is a tokenizer plus the chat template it is tested with.
"""

from __future__ import annotations

import json
import lzma
import shutil
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "tokenizers"

FAMILIES: dict[str, tuple[str, str | None]] = {
    "qwen3": ("qwen3", None),            # its own template (rewrites earlier turns)
    "qwen2.5": ("qwen3", "qwen2.5"),     # the same vocabulary, Qwen2.5-Instruct's template
    "llama3": ("llama3-style", None),    # Llama-3-Instruct's template
    "llama3.1": ("llama3.1-style", None),  # Llama-3.1-Instruct's template (JSON tool calls)
    "mistral": ("mistral-7b", "mistral"),  # Metaspace + byte fallback, [INST] template
}
"""family -> (fixture folder, named template replacing the shipped one or None)."""


def unpack(folder: str, out: Path, template: str | None = None) -> Path:
    """Copy fixture `folder` into `out` with tokenizer.json decompressed; return `out`."""
    src = FIXTURES / folder
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_bytes(lzma.decompress((src / "tokenizer.json.xz").read_bytes()))
    shutil.copy(src / "tokenizer_config.json", out / "tokenizer_config.json")
    if (src / "chat_template.jinja").is_file():
        shutil.copy(src / "chat_template.jinja", out / "chat_template.jinja")
    if template is not None:
        from astrai.data.chat_templates import NAMED_TEMPLATES

        cfg = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
        cfg["chat_template"] = NAMED_TEMPLATES[template]
        (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    return out


def family_dir(family: str, root: Path) -> Path:
    """The tokenizer directory of `family` under `root` (unpacked once)."""
    folder, template = FAMILIES[family]
    out = root / family
    if not (out / "tokenizer.json").is_file():
        unpack(folder, out, template)
    return out


ARCH = {"qwen3": "Qwen2Config", "qwen2.5": "Qwen2Config", "llama3": "LlamaConfig",
        "llama3.1": "LlamaConfig", "mistral": "MistralConfig"}
"""family -> transformers config class of the tiny model built around its tokenizer."""


def tiny_hf_model(family: str, root: Path, seed: int = 0, context: int = 1024) -> Path:
    """A random 2-layer HF model of `family`'s architecture (hidden 32, `context`
    positions) saved with the family's tokenizer files in `root/<family>-model`; needs
    transformers."""
    import torch
    import transformers

    from astrai.data.tokenizer import Tokenizer

    out = root / f"{family}-model"
    if (out / "config.json").is_file():
        return out
    folder, template = FAMILIES[family]
    unpack(folder, out, template)
    vocab = Tokenizer.load(out).vocab_size
    extra = {"sliding_window": None} if family == "mistral" else {}
    config = getattr(transformers, ARCH[family])(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
        tie_word_embeddings=family.startswith("qwen"), **extra)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # larger than init so greedy picks vary with context
            p.normal_(0, 0.2) if p.dim() > 1 else p.fill_(1.0)
    model.save_pretrained(out)
    return out
