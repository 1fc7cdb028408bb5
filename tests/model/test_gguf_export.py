"""GGUF export read back with gguf.GGUFReader: tensor names, shapes and values (q/k rows
un-permuted for llama, Q8_0 within its rounding), architecture and hyperparameters, the
tokenizer metadata of astrai's byte-level BPE and of real families' tokenizers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from astrai.errors import UnsupportedModelError
from astrai.model.checkpoint import save_checkpoint
from astrai.model.gguf_export import MARKER_KEY, export_gguf
from astrai.model.gguf_names import gguf_name, permute_rows, unpermute_rows
from astrai.model.gguf_vocab import BYTE, CONTROL, NORMAL, USER_DEFINED, read_vocab
from tests.model.conftest import random_model, small_config
from tests.real_tokenizers import family_dir

gguf = pytest.importorskip("gguf")

CORPUS = [f"the quick brown fox {i} jumps over the lazy dog, said {i * 7}." for i in range(300)]


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory) -> Path:
    """astrai's own byte-level BPE (astrai tokenizer train), 320 tokens."""
    from astrai.data.bpe import train_tokenizer

    root = tmp_path_factory.mktemp("bpe")
    (root / "corpus.txt").write_text("\n".join(CORPUS))
    train_tokenizer([root / "corpus.txt"], 320, root / "tok")
    return root / "tok"


def checkpoint(root: Path, tok: Path | None, **overrides):
    config = small_config(**{"vocab_size": 320, "dim": 64, "ffn_dim": 96, **overrides})
    model = random_model(config)
    save_checkpoint(root / "ck", model, config, tokenizer_dir=tok, meta={"step": 1})
    return root / "ck", model, config


def fields(r) -> dict:
    out = {}
    for k, f in r.fields.items():
        if not k.startswith("GGUF."):
            out[k] = f.contents()
    return out


def tensors(r) -> dict:
    """name -> (GGML type name, float32 array in the row-major shape torch has)."""
    out = {}
    for t in r.tensors:
        x = gguf.quants.dequantize(t.data, t.tensor_type)
        out[t.name] = (t.tensor_type.name, np.array(x, dtype=np.float32).reshape(
            tuple(int(n) for n in reversed(t.shape))))
    return out


FAMILIES = {  # name -> (config overrides, llama.cpp arch)
    "llama": ({}, "llama"),
    "qwen2": ({"qkv_bias": True, "tie_embeddings": True}, "qwen2"),
    "qwen3": ({"qk_norm": True, "head_dim": 32, "tie_embeddings": True}, "qwen3"),
    "mistral": ({"sliding_window": 16}, "llama"),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_tensors_and_hyperparameters(tmp_path, bpe_dir, family):
    overrides, arch = FAMILIES[family]
    ck, model, c = checkpoint(tmp_path, bpe_dir, **overrides)
    r = gguf.GGUFReader(export_gguf(ck, tmp_path / "m.gguf", dtype=torch.float32))
    meta, got = fields(r), tensors(r)
    assert meta["general.architecture"] == arch
    want = {f"{arch}.{k}": v for k, v in {
        "context_length": 16 if family == "mistral" else 64, "embedding_length": 64,
        "block_count": 2, "feed_forward_length": 96, "attention.head_count": 4,
        "attention.head_count_kv": 2, "attention.key_length": c.hdim,
        "attention.value_length": c.hdim, "rope.dimension_count": c.hdim,
        "vocab_size": 320, "rope.freq_base": 10000.0}.items()}
    assert {k: meta[k] for k in want} == want
    assert meta[f"{arch}.attention.layer_norm_rms_epsilon"] == pytest.approx(c.norm_eps)
    assert json.loads(meta[MARKER_KEY])["source"] == str(ck.resolve())
    state = model.state_dict()
    names = {gguf_name(k) for k in state if not (c.tie_embeddings and k == "lm_head.weight")}
    assert set(got) == names
    assert ("output.weight" in got) == (not c.tie_embeddings)  # tied: llama.cpp reuses token_embd
    for k, v in state.items():
        if c.tie_embeddings and k == "lm_head.weight":
            continue
        qtype, x = got[gguf_name(k)]
        assert qtype == "F32"
        x = torch.from_numpy(x)
        if arch == "llama" and ".attn.q_proj." in k:
            x = unpermute_rows(x, c.n_heads)
        elif arch == "llama" and ".attn.k_proj." in k:
            x = unpermute_rows(x, c.kv_heads)
        assert torch.equal(x, v), k


def test_permutation_pairs_halves_per_head():
    # head h, row j of the first half -> row 2j; row j of the second half -> row 2j + 1
    H, D = 3, 8
    w = torch.arange(H * D, dtype=torch.float32)[:, None].repeat(1, 2)
    p = permute_rows(w, H)
    for h in range(H):
        for j in range(D // 2):
            assert p[h * D + 2 * j, 0] == h * D + j
            assert p[h * D + 2 * j + 1, 0] == h * D + j + D // 2
    assert torch.equal(unpermute_rows(p, H), w)


def test_q8_0_and_float_dtypes(tmp_path, bpe_dir):
    ck, model, c = checkpoint(tmp_path, bpe_dir, ffn_dim=48)  # ffn_down rows: 48, not 32·k
    state = {gguf_name(k): v for k, v in model.state_dict().items()}
    r = gguf.GGUFReader(export_gguf(ck, tmp_path / "q.gguf", quantize="q8_0"))
    assert fields(r)["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q8_0
    for name, (qtype, x) in tensors(r).items():
        v = state[name]
        if v.dim() == 1:
            assert qtype == "F32" and np.array_equal(x, v.numpy()), name
        elif name.endswith("ffn_down.weight"):
            assert qtype == "F16", name  # llama.cpp's fallback for rows Q8_0 cannot block
        else:
            assert qtype == "Q8_0", name
            if "attn_q" in name or "attn_k" in name:
                heads = c.n_heads if "attn_q" in name else c.kv_heads
                x = unpermute_rows(torch.from_numpy(x), heads).numpy()
            blocks = v.numpy().reshape(-1, 32)
            step = np.abs(blocks).max(axis=1, keepdims=True) / 127  # one int8 step per block
            err = np.abs(x.reshape(-1, 32) - blocks)
            # half a step of rounding, plus the fp16 rounding of the scale over 127 steps
            assert (err <= (0.5 + 127 * 2.0**-11) * step + 1e-7).all(), name
            assert err.max() > 0  # it is quantized, not copied
    for dtype, ftype, qname in ((torch.float16, "MOSTLY_F16", "F16"),
                                (torch.bfloat16, "MOSTLY_BF16", "BF16")):
        r = gguf.GGUFReader(export_gguf(ck, tmp_path / f"{qname}.gguf", dtype=dtype))
        assert fields(r)["general.file_type"] == getattr(gguf.LlamaFileType, ftype)
        got = tensors(r)
        assert got["output_norm.weight"][0] == "F32"
        qtype, x = got["blk.0.ffn_up.weight"]
        want = state["blk.0.ffn_up.weight"].to(dtype).float().numpy()
        assert qtype == qname and np.array_equal(x, want)


def test_astrai_bpe_tokenizer_metadata(tmp_path, bpe_dir):
    ck, _, _ = checkpoint(tmp_path, bpe_dir)
    meta = fields(gguf.GGUFReader(export_gguf(ck, tmp_path / "m.gguf")))
    tok = json.loads((bpe_dir / "tokenizer.json").read_text())
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    assert meta["tokenizer.ggml.tokens"] == [by_id[i] for i in range(320)]
    merges = [" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]]
    assert meta["tokenizer.ggml.merges"] == merges and merges
    types = meta["tokenizer.ggml.token_type"]
    specials = {a["id"] for a in tok["added_tokens"]}
    assert all(types[i] == (CONTROL if i in specials else NORMAL) for i in range(320))
    ids = {t: i for i, t in by_id.items()}
    assert meta["tokenizer.ggml.bos_token_id"] == ids["<|bos|>"]
    assert meta["tokenizer.ggml.eos_token_id"] == ids["<|endoftext|>"]
    assert meta["tokenizer.ggml.padding_token_id"] == ids["<|pad|>"]
    assert meta["tokenizer.ggml.add_bos_token"] is True  # astrai's post-processor adds it
    assert meta["tokenizer.chat_template"] == (bpe_dir / "chat_template.jinja").read_text()


@pytest.mark.parametrize("family,pre", [("qwen3", "qwen2"), ("llama3", "llama-bpe")])
def test_real_byte_level_families(tmp_path, family, pre):
    d = family_dir(family, tmp_path)
    tok = json.loads((d / "tokenizer.json").read_text())
    n = max(a["id"] for a in tok["added_tokens"]) + 3  # two padding rows
    v = read_vocab(d, n)
    assert v.model == "gpt2" and v.pre == pre
    assert v.tokens[-1] == f"[PAD{n - 1}]" and len(v.types) == n
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    ids = {a["content"]: a["id"] for a in tok["added_tokens"]}
    assert v.special["eos"] == ids[cfg["eos_token"]]
    assert v.add_bos is (family == "llama3")
    assert v.chat_template == cfg["chat_template"]
    # added tokens typed as llama.cpp's converter types them: Qwen3's <|fim_prefix|> ..
    # <|file_sep|> are not flagged special but look it (control); <think>, <tool_call> not
    looks = {i for t, i in ids.items() if t.startswith("<|") and t.endswith("|>")}
    assert {i: v.types[i] for i in ids.values()} == {
        a["id"]: CONTROL if a["special"] or a["id"] in looks else USER_DEFINED
        for a in tok["added_tokens"]}
    assert (family == "qwen3") == any(not a["special"] and a["id"] in looks
                                      for a in tok["added_tokens"])


ADDED = [("<|fim_prefix|>", False), ("<think>", False), ("<｜tool▁sep｜>", False),
         ("<|tool|>", True), ("[ctrl]", True)]
"""Added tokens of the kinds real vocabularies carry (Qwen3: `<|fim_prefix|>` and `<think>`
not flagged special; DeepSeek: fullwidth bars), with their `special` flag."""


def with_added_tokens(tok_dir: Path, out: Path) -> Path:
    """A copy of tokenizer directory `tok_dir` with ADDED appended (ids after the vocab)."""
    from tokenizers import AddedToken, Tokenizer

    shutil.copytree(tok_dir, out)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    for text, special in ADDED:
        token = AddedToken(text, special=special, normalized=False)
        (tok.add_special_tokens if special else tok.add_tokens)([token])
    tok.save(str(out / "tokenizer.json"))
    return out


def test_token_types_as_llama_cpps_converter(tmp_path, bpe_dir):
    """The token types in the file follow llama.cpp's convert_hf_to_gguf.py: an added token
    is control when flagged special or when it looks special (`does_token_look_special`:
    `<|...|>`, `<｜...｜>`; llama.cpp never prints control tokens as text), user-defined
    otherwise; vocabulary tokens normal, padding rows user-defined."""
    d = with_added_tokens(bpe_dir, tmp_path / "tok")
    tok = json.loads((d / "tokenizer.json").read_text())
    added = {a["id"]: a for a in tok["added_tokens"]}
    ck, _, _ = checkpoint(tmp_path, d, vocab_size=max(added) + 3)
    meta = fields(gguf.GGUFReader(export_gguf(ck, tmp_path / "m.gguf")))
    ids = {a["content"]: i for i, a in added.items()}
    want = {"<|fim_prefix|>": CONTROL, "<think>": USER_DEFINED, "<｜tool▁sep｜>": CONTROL,
            "<|tool|>": CONTROL, "[ctrl]": CONTROL, "<|im_end|>": CONTROL}
    types = meta["tokenizer.ggml.token_type"]
    assert {t: types[ids[t]] for t in want} == want
    assert [types[i] for i in range(len(types)) if i not in added] == \
        [NORMAL] * (len(types) - len(added) - 2) + [USER_DEFINED] * 2


def test_mistral_tokenizer_as_llama_vocab(tmp_path):
    d = family_dir("mistral", tmp_path)
    ck, _, _ = checkpoint(tmp_path, d, vocab_size=32000, dim=32, ffn_dim=32)
    meta = fields(gguf.GGUFReader(export_gguf(ck, tmp_path / "m.gguf")))
    assert meta["tokenizer.ggml.model"] == "llama" and "tokenizer.ggml.pre" not in meta
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    scores = meta["tokenizer.ggml.scores"]
    assert tokens[:3] == ["<unk>", "<s>", "</s>"] and types[:3] == [2, CONTROL, CONTROL]
    assert tokens[3] == "<0x00>" and types[3:259] == [BYTE] * 256
    # score = minus the rank of the merge making the token: merge order preserved
    tok = json.loads((d / "tokenizer.json").read_text())
    first = tok["model"]["merges"][0]
    first = first.replace(" ", "") if isinstance(first, str) else "".join(first)
    assert scores[tokens.index(first)] == 0.0 and scores[tokens.index("▁the")] < 0
    assert meta["tokenizer.ggml.add_space_prefix"] is True
    assert meta["tokenizer.ggml.add_bos_token"] is True
    assert (meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"],
            meta["tokenizer.ggml.unknown_token_id"]) == (1, 2, 0)


def test_rope_scaling_metadata(tmp_path, bpe_dir):
    from astrai.model.rope import rope_inv_freq

    ck, _, c = checkpoint(tmp_path, bpe_dir, rope_scaling={
        "type": "llama3", "factor": 8.0, "original_max_position_embeddings": 512})
    got = tensors(gguf.GGUFReader(export_gguf(ck, tmp_path / "l3.gguf")))
    factors = torch.from_numpy(got["rope_freqs.weight"][1])
    plain, _ = rope_inv_freq(c.hdim, c.rope_theta)
    scaled, _ = rope_inv_freq(c.hdim, c.rope_theta, c.rope_scaling)
    torch.testing.assert_close(plain / factors, scaled)  # llama.cpp divides by the factors
    assert factors.max() == 8.0 and factors.min() == 1.0  # long waves scaled, short kept
    assert ((factors > 1) & (factors < 8)).any()  # and the smooth band between
    ck2, _, _ = checkpoint(tmp_path / "b", bpe_dir, rope_scaling={"type": "linear",
                                                                  "factor": 2.0})
    meta = fields(gguf.GGUFReader(export_gguf(ck2, tmp_path / "lin.gguf")))
    assert (meta["llama.rope.scaling.type"], meta["llama.rope.scaling.factor"]) == ("linear", 2.0)
    ck3, _, c3 = checkpoint(tmp_path / "c", bpe_dir, qkv_bias=True,
                            rope_scaling={"type": "ntk", "factor": 4.0})
    meta = fields(gguf.GGUFReader(export_gguf(ck3, tmp_path / "ntk.gguf")))
    base = 10000.0 * 4.0 ** (c3.hdim / (c3.hdim - 2))
    assert meta["qwen2.rope.freq_base"] == pytest.approx(base, rel=1e-6)
    assert "qwen2.rope.scaling.type" not in meta
    ck4, _, _ = checkpoint(tmp_path / "d", bpe_dir, qkv_bias=True, rope_scaling={
        "type": "llama3", "factor": 8.0, "original_max_position_embeddings": 16})
    with pytest.raises(UnsupportedModelError, match="only for the llama"):
        export_gguf(ck4, tmp_path / "no.gguf")
    assert not (tmp_path / "no.gguf").exists()


def test_yarn_metadata(tmp_path, bpe_dir):
    import math

    yarn = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    ck, _, _ = checkpoint(tmp_path, bpe_dir, rope_scaling=yarn)
    meta = fields(gguf.GGUFReader(export_gguf(ck, tmp_path / "y.gguf")))
    assert meta["llama.rope.scaling.type"] == "yarn"
    assert (meta["llama.rope.scaling.factor"], meta["llama.rope.scaling.original_context_length"],
            meta["llama.rope.scaling.yarn_beta_fast"], meta["llama.rope.scaling.yarn_beta_slow"]
            ) == (4.0, 16, 32.0, 1.0)
    assert "llama.rope.scaling.yarn_attn_factor" not in meta  # ggml's default is astrai's
    ck, _, _ = checkpoint(tmp_path / "b", bpe_dir, rope_scaling={**yarn, "attention_factor": 1.0})
    meta = fields(gguf.GGUFReader(export_gguf(ck, tmp_path / "y1.gguf")))
    # ggml multiplies attn_factor by 1 + 0.1·ln(factor): the product must be astrai's 1.0
    assert meta["llama.rope.scaling.yarn_attn_factor"] * (0.1 * math.log(4.0) + 1) == \
        pytest.approx(1.0, rel=1e-6)
