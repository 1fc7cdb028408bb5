"""Export keeps a real family's tokenizer: AutoTokenizer on the exported directory gives the
source directory's ids for 30 texts, under the transformers installed (4.x or 5.x), and a
Mistral stays a Mistral."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from astrai.data.tokenizer import Tokenizer
from astrai.model.hf_export import export_hf
from tests.real_tokenizers import FAMILIES, tiny_hf_model

pytest.importorskip("transformers")

TEXTS = [" leading space", "Hello world", "  two spaces", "\nnewline first", "trailing \n",
         "日本語のテキスト", "emoji 🙂🙃", "مرحبا بالعالم", "tabs\tin\ttext", "a  b   c",
         "<s> literal", "</s>", "<|im_start|>user", "[INST] hi [/INST]", "x", "",
         "Numbers 1234567890", "CamelCaseWord", "don't you're", "café naïve", "   ",
         "line1\r\nline2", "<think>\n\n</think>", "ALL CAPS TEXT", "mixed 中文 and English",
         "\u200bzero width", "ß ẞ ﬁ", "🙂", "end.", "The quick brown fox."]

HF = textwrap.dedent("""
    import json, sys
    from transformers import AutoTokenizer
    pairs, texts = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    out = {}
    for fam, (src, dst) in pairs.items():
        a, b = AutoTokenizer.from_pretrained(src), AutoTokenizer.from_pretrained(dst)
        out[fam] = [[a(t)["input_ids"] for t in texts], [b(t)["input_ids"] for t in texts]]
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_exported_tokenizer_ids_equal_the_source(tmp_path):
    assert len(TEXTS) == 30
    pairs = {}
    # qwen2.5 shares qwen3's tokenizer files (only the template differs): one export covers both
    for fam in [f for f in FAMILIES if f != "qwen2.5"]:
        src = tiny_hf_model(fam, tmp_path)
        dst = export_hf(src, tmp_path / f"{fam}-export")
        pairs[fam] = (str(src), str(dst))
        cfg = json.loads((dst / "config.json").read_text())
        want = json.loads((src / "config.json").read_text())["model_type"]
        assert cfg["model_type"] == want, fam  # a Mistral stays a Mistral
    res = subprocess.run([sys.executable, "-c", HF, json.dumps(pairs), json.dumps(TEXTS)],
                         check=True, capture_output=True, text=True, timeout=300)
    got = json.loads(res.stdout.strip().splitlines()[-1])
    for fam, (src, dst) in pairs.items():
        theirs_src, theirs_dst = got[fam]
        assert theirs_dst == theirs_src, fam
        ours = Tokenizer.load(dst)
        assert [ours.encode(t, add_special_tokens=True) for t in TEXTS] == theirs_src, fam
