"""GGUF in: astrai -> `export_gguf` -> load gives the same config, logits and greedy tokens
(llama with its q/k row permutation undone, qwen2's biases, qwen3's QK-norm, tied and
untied, RoPE scaling); quantized weights equal gguf's own dequantization, said in one line;
the tokenizer rebuilt from the GGUF metadata encodes and renders chats as the original; a
HF model written as a GGUF (astrai's exporter, and llama.cpp's convert_hf_to_gguf.py where
ASTRAI_CONVERT_HF_TO_GGUF names it) equals the HF model; hostile files are one line."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from astrai.data.tokenizer import Tokenizer
from astrai.errors import AstraiError
from astrai.model.checkpoint import save_checkpoint
from astrai.model.hf import load_pretrained, read_config
from tests.model.conftest import random_model, small_config

gguf = pytest.importorskip("gguf")
from astrai.model.gguf_export import export_gguf

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

TEXTS = ["Hello world, it's 2024!", "  two  spaces\nand a newline", "ünïcödé 12345 tokens",
         "<|im_start|>user\nhi<|im_end|>"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    from astrai.data.testing import tiny_tokenizer

    return tiny_tokenizer(tmp_path_factory.mktemp("tok"), 320)


def checkpoint(root: Path, tok: Tokenizer, **overrides):
    config = small_config(**{"vocab_size": tok.vocab_size, "dim": 64, "ffn_dim": 96,
                             **overrides})
    model = random_model(config)
    with torch.no_grad():  # larger than init, so greedy picks vary with the context
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(p.numel()))
    save_checkpoint(root / "ck", model, config, tokenizer_dir=tok.path, meta={"step": 1})
    return root / "ck", model, config


def greedy(model, ids: list[int], n: int) -> list[int]:
    """Naive greedy decoding over the full forward (no cache)."""
    out = list(ids)
    with torch.no_grad():
        for _ in range(n):
            out.append(int(model(torch.tensor([out])).logits[0, -1].argmax()))
    return out[len(ids):]


FAMILIES = {  # name -> (config overrides, llama.cpp arch)
    "llama": ({}, "llama"),
    "qwen2": ({"qkv_bias": True, "tie_embeddings": True}, "qwen2"),
    "qwen3": ({"qk_norm": True, "head_dim": 32, "tie_embeddings": True}, "qwen3"),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_f32_same_config_logits_and_greedy_tokens(tmp_path, tok, family):
    overrides, arch = FAMILIES[family]
    ck, model, config = checkpoint(tmp_path, tok, **overrides)
    out = export_gguf(ck, tmp_path / "m.gguf", dtype=torch.float32)
    got, got_config, info = load_pretrained(out)
    assert info["format"] == "gguf" and info["model_type"] == arch and info["notes"] == []
    keep = {"init_std", "moe_aux_loss_coef"}  # training-only fields a GGUF does not carry
    assert ({k: v for k, v in got_config.model_dump().items() if k not in keep}
            == {k: v for k, v in config.model_dump().items() if k not in keep})
    ids = tok.encode(TEXTS[0])
    x = torch.tensor([ids])
    with torch.no_grad():
        torch.testing.assert_close(got(x).logits, model(x).logits, rtol=1e-5, atol=1e-5)
    assert greedy(got, ids, 12) == greedy(model, ids, 12)
    assert read_config(out)[0] == got_config


@pytest.mark.parametrize("scaling", [
    {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 32},
    {"type": "linear", "factor": 2.0},
    {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
     "attention_factor": 1.3},
])
def test_rope_scaling_round_trips(tmp_path, tok, scaling):
    ck, model, config = checkpoint(tmp_path, tok, rope_scaling=scaling, head_dim=32)
    got, got_config, _ = load_pretrained(export_gguf(ck, tmp_path / "m.gguf"))
    want = config.rope_scaling.model_dump()
    have = got_config.rope_scaling.model_dump()
    assert {k: v for k, v in have.items() if k != "attention_factor"} == {
        k: v for k, v in want.items() if k != "attention_factor"}
    if scaling["type"] == "yarn":
        assert math.isclose(have["attention_factor"], 1.3, rel_tol=1e-6)
    torch.testing.assert_close(got.rope_cos, model.rope_cos, rtol=1e-5, atol=1e-6)


def test_llama3_rope_freqs_astrai_cannot_reproduce_is_refused(tmp_path, tok):
    src = export_gguf(checkpoint(tmp_path, tok, rope_scaling={
        "type": "llama3", "factor": 8.0, "original_max_position_embeddings": 32})[0],
        tmp_path / "m.gguf")
    bad = rewrite(src, tmp_path / "bad.gguf",
                  tensors={"rope_freqs.weight": lambda a: a * np.linspace(1, 3, a.size)})
    with pytest.raises(AstraiError, match=r"bad\.gguf: rope_freqs\.weight is not Llama 3"):
        read_config(bad)


def test_q8_0_weights_dequantized_as_gguf_does_and_said(tmp_path, tok):
    ck, _, _ = checkpoint(tmp_path, tok)
    out = export_gguf(ck, tmp_path / "m.gguf", quantize="q8_0")
    model, _, info = load_pretrained(out)
    note = f"{out}: q8_0 weights dequantized to float32; astrai has no matching format"
    assert info["notes"] == [note]
    r = gguf.GGUFReader(out)
    t = next(t for t in r.tensors if t.name == "blk.1.ffn_down.weight")
    assert t.tensor_type.name == "Q8_0"
    want = gguf.quants.dequantize(t.data, t.tensor_type)
    assert torch.equal(model.layers[1].mlp.down_proj.weight, torch.from_numpy(want))


def test_q4_0_and_f16_files(tmp_path, tok):
    """A q4_0 file (the f32 export re-encoded with gguf.quants) and an f16 one: the weights
    are gguf's dequantization / the stored halves; f16 stays f16 when no dtype is asked."""
    ck, model, _ = checkpoint(tmp_path, tok)
    src = export_gguf(ck, tmp_path / "m.gguf", dtype=torch.float32)
    q4 = rewrite(src, tmp_path / "q4.gguf", qtype=gguf.GGMLQuantizationType.Q4_0)
    got, _, info = load_pretrained(q4)
    note = f"{q4}: q4_0 weights kept as astrai's int4 (the same numbers; as --quantize int4)"
    assert info["notes"] == [note]
    w = model.layers[0].mlp.up_proj.weight.detach().numpy()
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_0)
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_0)
    assert torch.equal(got.layers[0].mlp.up_proj.weight, torch.from_numpy(want))
    # the engine's loader keeps the file's q4_0 bytes as int4: the same values and scales
    from astrai.infer.loading import load_model
    from astrai.model.quant4 import Int4Linear

    up = load_model(q4, device="cpu").layers[0].mlp.up_proj
    assert isinstance(up, Int4Linear)
    blocks = torch.from_numpy(raw).reshape(up.out_features, -1, 18)
    assert torch.equal(up.qweight, blocks[..., 2:].reshape(up.out_features, -1))
    assert torch.equal(up.scale, blocks[..., :2].contiguous().view(torch.float16).float()
                       .squeeze(-1))
    assert type(load_model(q4, device="cpu", quantize="int8").layers[0].mlp.up_proj
                ).__name__ == "Int8Linear"  # a format asked for wins
    half = export_gguf(ck, tmp_path / "h.gguf", dtype=torch.float16)
    got, _, info = load_pretrained(half)
    assert got.layers[0].mlp.up_proj.weight.dtype == torch.float16 and info["notes"] == []
    assert torch.equal(got.layers[0].mlp.up_proj.weight,
                       model.layers[0].mlp.up_proj.weight.half())


def test_tokenizer_from_gguf_encodes_and_renders_as_the_original(tmp_path, tok):
    ck, _, _ = checkpoint(tmp_path, tok)
    theirs = Tokenizer.from_gguf(export_gguf(ck, tmp_path / "m.gguf"))
    for text in TEXTS:
        assert theirs.encode(text) == tok.encode(text), text
        assert theirs.decode(tok.encode(text)) == tok.decode(tok.encode(text))
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    assert theirs.render_chat(msgs, add_generation_prompt=True) == tok.render_chat(
        msgs, add_generation_prompt=True)
    assert theirs.encode_chat(msgs) == tok.encode_chat(msgs)
    assert (theirs.bos_id, theirs.eos_id, theirs.pad_id) == (tok.bos_id, tok.eos_id, tok.pad_id)
    assert theirs.stop_ids == tok.stop_ids


@pytest.mark.parametrize("family", ["llama3", "mistral"])
def test_real_families_tokenizers_round_trip(tmp_path, family):
    """Llama 3 (gpt2: byte-level BPE with its split regex; Qwen's, with 151k tokens, in the
    converter test) and Mistral
    (llama: SentencePiece BPE whose merges are recovered from the scores)."""
    from astrai.model.gguf_export import _tokenizer
    from astrai.model.gguf_vocab import read_vocab
    from tests.real_tokenizers import family_dir

    src = family_dir(family, tmp_path)
    ours = Tokenizer.load(src)
    w = gguf.GGUFWriter(tmp_path / "v.gguf", "llama")  # a vocab-only file, as llama.cpp's
    _tokenizer(w, read_vocab(src, ours.vocab_size))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    theirs = Tokenizer.from_gguf(tmp_path / "v.gguf")
    for text in [*TEXTS, "IT'S 1999: 'don't' — WON'T", " leading space"]:
        assert theirs.encode(text) == ours.encode(text), text
        assert theirs.decode(ours.encode(text)) == ours.decode(ours.encode(text)), text
    assert theirs.chat_template == ours.chat_template
    assert theirs.stop_ids == ours.stop_ids


def test_hf_model_written_as_llama_cpp_converts_equals_hf(tmp_path):
    """A HF Mistral (llama arch: q/k rows permuted) written by astrai's exporter the way
    llama.cpp's converter writes it: greedy tokens equal the HF directory's through astrai's
    HF loader (itself tested equal to transformers, tests/model/test_hf_equivalence.py)."""
    pytest.importorskip("transformers")
    from tests.real_tokenizers import tiny_hf_model

    hf_dir = tiny_hf_model("mistral", tmp_path)
    check_equals_hf(hf_dir, export_gguf(hf_dir, tmp_path / "m.gguf", dtype=torch.float32))


def check_equals_hf(hf_dir: Path, out: Path) -> None:
    hf, _, _ = load_pretrained(hf_dir, dtype=torch.float32)
    got, _, _ = load_pretrained(out, dtype=torch.float32)
    ids = Tokenizer.load(hf_dir).encode(TEXTS[0])
    assert greedy(got, ids, 10) == greedy(hf, ids, 10)


CONVERTER = os.environ.get("ASTRAI_CONVERT_HF_TO_GGUF")


@pytest.mark.skipif(not CONVERTER, reason="set ASTRAI_CONVERT_HF_TO_GGUF to llama.cpp's "
                    "convert_hf_to_gguf.py (in llama-cpp-python's sdist, vendor/llama.cpp)")
@pytest.mark.parametrize("family", ["mistral", "qwen3"])
def test_llama_cpp_converter_output_equals_hf(tmp_path, family):
    pytest.importorskip("transformers")
    from tests.real_tokenizers import tiny_hf_model

    hf_dir = tiny_hf_model(family, tmp_path)
    out = tmp_path / f"{family}.gguf"
    # the converter imports sentencepiece at the top of gguf-py's vocab module but needs it
    # only for tokenizer.model files, which these directories do not have
    shim = ("import importlib.machinery, runpy, sys, types; "
            "sp = types.ModuleType('sentencepiece'); sp.SentencePieceProcessor = None; "
            "sp.__spec__ = importlib.machinery.ModuleSpec('sentencepiece', None); "
            "sys.modules.setdefault('sentencepiece', sp); sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    subprocess.run([sys.executable, "-c", shim, CONVERTER, str(hf_dir), "--outfile", str(out),
                    "--outtype", "f32"], check=True, capture_output=True, timeout=300,
                   cwd=Path(CONVERTER).parent)
    check_equals_hf(hf_dir, out)
    if family == "qwen3":  # byte-level BPE: the tokenizer survives the converter
        ours, theirs = Tokenizer.load(hf_dir), Tokenizer.from_gguf(out)
        assert [theirs.encode(t) for t in TEXTS] == [ours.encode(t) for t in TEXTS]


# -- hostile files --------------------------------------------------------------------------

def rewrite(src: Path, dst: Path, *, fields: dict | None = None, drop: tuple = (),
            tensors: dict | None = None, shapes: dict | None = None, qtype=None,
            arch: str | None = None) -> Path:
    """A copy of GGUF `src` with metadata `fields` replaced ({key: (value, GGUFValueType)}),
    keys in `drop` left out, tensor data mapped by `tensors` ({name: fn(float32 array)}),
    declared `shapes` replaced, and 2-D weights re-encoded in `qtype`."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, arch or r.get_field("general.architecture").contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key in drop or key == "general.architecture":
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value, vtype = (fields or {}).get(key, (f.contents(), vtype))
        w.add_key_value(key, value, vtype, sub)
    for key, (value, vtype) in (fields or {}).items():
        if r.get_field(key) is None:
            w.add_key_value(key, value, vtype)
    for t in r.tensors:
        a = np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        a = (tensors or {}).get(t.name, lambda x: x)(a).astype(np.float32)
        q = qtype if qtype is not None and a.ndim == 2 else gguf.GGMLQuantizationType.F32
        data = gguf.quants.quantize(a, q)
        raw = (shapes or {}).get(t.name)
        w.add_tensor(t.name, data, raw_shape=raw, raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.fixture(scope="module")
def good(tmp_path_factory, tok) -> Path:
    root = tmp_path_factory.mktemp("good")
    return export_gguf(checkpoint(root, tok)[0], root / "good.gguf", dtype=torch.float32)


U32, STR = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.STRING


def hostile(good: Path, root: Path, case: str) -> Path:
    bad = root / f"{case}.gguf"
    if case == "truncated":
        bad.write_bytes(good.read_bytes()[: good.stat().st_size * 2 // 3])
        return bad
    kinds = {
        "arch": {"arch": "gptneox"},
        "blocks": {"fields": {"llama.block_count": (5, U32)}},
        "huge": {"fields": {"llama.embedding_length": (1 << 30, U32)}},
        "type": {"fields": {"llama.context_length": ("long", STR)}},
        "dims": {"tensors": {"blk.0.ffn_up.weight": lambda a: a.reshape(64, 96)}},
        "size": {"shapes": {"output_norm.weight": [1 << 20]}},
        "nan": {"tensors": {"blk.1.attn_v.weight": lambda a: np.where(a > 0.5, np.nan, a)}},
        "merges": {"drop": ("tokenizer.ggml.merges",)},
    }
    return rewrite(good, bad, **kinds[case])


HOSTILE = {  # case -> what the one line must say
    "truncated": r"truncated\.gguf: not a readable GGUF file .*re-download or re-convert",
    "arch": r"arch\.gguf: GGUF architecture 'gptneox' is not one astrai runs",
    "blocks": r"blocks\.gguf: config\.json says n_layers 5 but the weights hold 2 blocks",
    "huge": r"huge\.gguf \(GGUF metadata\): dim",
    "type": r"type\.gguf: metadata llama\.context_length is 'long', not an integer",
    "dims": r"dims\.gguf: .*mis-shaped layers\.0\.mlp\.up_proj\.weight \(64, 96\)",
    "size": r"size\.gguf: (not a readable GGUF file|tensor output_norm\.weight)",
    "nan": r"nan\.gguf: tensor blk\.1\.attn_v\.weight holds NaN or infinite values",
    "merges": r"merges\.gguf: a gpt2 .* without tokenizer\.ggml\.merges; .*re-convert",
}


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_files_are_one_line(tmp_path, good, case):
    from astrai.infer.loading import load_model, load_tokenizer

    bad = hostile(good, tmp_path, case)
    before = sorted(tmp_path.iterdir())
    with pytest.raises(AstraiError, match=HOSTILE[case]) as e:
        load_tokenizer(bad) if case == "merges" else load_model(bad, device="cpu")
    assert "\n" not in str(e.value)
    assert sorted(tmp_path.iterdir()) == before  # nothing written beside it
