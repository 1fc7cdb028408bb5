"""`astrai export --format gguf` through Typer's CliRunner: the file, the one-line refusals
(exit 2, nothing written), --overwrite replacing only an earlier export; and, in llama.cpp
(llama-cpp-python), greedy tokens equal to astrai's and special tokens parsed and printed
as llama.cpp does. The llama.cpp tests skip where llama-cpp-python is not installed, and
fail instead on CI (`CI=true` or ASTRAI_REQUIRE_LLAMA_CPP=1, which .ci/run sets): there a
missing or broken build must not pass as a skip."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from astrai.model.checkpoint import save_checkpoint
from astrai_cli.main import app
from tests.cli.test_info_export import make_checkpoint, one_line_error
from tests.model.conftest import random_model, small_config
from tests.model.test_gguf_export import with_added_tokens

gguf = pytest.importorskip("gguf")
runner = CliRunner()


@pytest.fixture(scope="module")
def bpe_ck(tmp_path_factory) -> Path:
    """A tiny llama checkpoint with astrai's own byte-level BPE tokenizer."""
    from astrai.data.bpe import train_tokenizer

    root = tmp_path_factory.mktemp("ck")
    (root / "c.txt").write_text("\n".join(f"one two three {i} four five." for i in range(200)))
    train_tokenizer([root / "c.txt"], 300, root / "tok")
    config = small_config(vocab_size=300, dim=64, ffn_dim=128, max_seq_len=128)
    with torch.no_grad():  # larger than init, so greedy picks vary with the context
        model = random_model(config)
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
    save_checkpoint(root / "ck", model, config, tokenizer_dir=root / "tok", meta={"step": 1})
    return root / "ck"


def llama_cpp_or_skip():
    """The llama_cpp module; a skip without it, a failure where CI requires it."""
    try:
        import llama_cpp
    except (ImportError, OSError, RuntimeError) as e:  # also a library that does not load
        if (os.environ.get("CI", "").lower() == "true"
                or os.environ.get("ASTRAI_REQUIRE_LLAMA_CPP") == "1"):
            pytest.fail(f"llama_cpp does not import on CI ({e}); .ci/run installs "
                        "llama-cpp-python before the tests")
        pytest.skip("llama-cpp-python is not installed (pip install llama-cpp-python)")
    return llama_cpp


def export(*args: str):
    return runner.invoke(app, ["export", *args])


def leftovers(d: Path, name: str) -> list[str]:
    return [p.name for p in d.iterdir() if p.name.startswith(f".{name}.")]


def test_export_gguf_and_overwrite(tmp_path, bpe_ck):
    out = tmp_path / "m.gguf"
    res = export(str(bpe_ck), str(out), "--format", "gguf", "--dtype", "f16")
    assert res.exit_code == 0, res.output
    assert "gguf" in res.stdout and out.is_file()
    r = gguf.GGUFReader(out)
    assert r.get_field("general.file_type").contents() == gguf.LlamaFileType.MOSTLY_F16
    msg = one_line_error(export(str(bpe_ck), str(out), "--format", "gguf"))
    assert "already exists" in msg and "--overwrite" in msg
    res = export(str(bpe_ck), str(out), "--format", "gguf", "--quantize", "q8_0", "--overwrite")
    assert res.exit_code == 0, res.output
    r = gguf.GGUFReader(out)
    assert r.get_field("general.file_type").contents() == gguf.LlamaFileType.MOSTLY_Q8_0
    assert leftovers(tmp_path, "m.gguf") == []


def test_overwrite_replaces_only_an_earlier_export(tmp_path, bpe_ck):
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(b"GGUF not mine")
    msg = one_line_error(export(str(bpe_ck), str(mine), "--format", "gguf", "--overwrite"))
    assert "not an earlier astrai GGUF export" in msg and "astrai.export" in msg
    assert mine.read_bytes() == b"GGUF not mine"
    (tmp_path / "adir").mkdir()
    msg = one_line_error(export(str(bpe_ck), str(tmp_path / "adir"), "--format", "gguf",
                                "--overwrite"))
    assert "a directory" in msg
    # a GGUF someone else wrote (no astrai.export key) is refused as well
    w = gguf.GGUFWriter(tmp_path / "other.gguf", "llama")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    before = (tmp_path / "other.gguf").read_bytes()
    one_line_error(export(str(bpe_ck), str(tmp_path / "other.gguf"), "--format", "gguf",
                          "--overwrite"))
    assert (tmp_path / "other.gguf").read_bytes() == before
    # a truncated export cannot be read back, so it is not known to be ours
    assert export(str(bpe_ck), str(tmp_path / "t.gguf"), "--format", "gguf").exit_code == 0
    (tmp_path / "t.gguf").write_bytes((tmp_path / "t.gguf").read_bytes()[:3000])
    msg = one_line_error(export(str(bpe_ck), str(tmp_path / "t.gguf"), "--format", "gguf",
                                "--overwrite"))
    assert "not an earlier astrai GGUF export" in msg


def test_refusals_are_one_line(tmp_path, bpe_ck):
    moe = tmp_path / "moe"
    moe.mkdir()
    make_checkpoint(moe / "ck", n_experts=4, moe_top_k=1)
    msg = one_line_error(export(str(moe / "ck"), str(tmp_path / "x.gguf"), "--format", "gguf"))
    assert "mixture-of-experts" in msg
    wl = tmp_path / "wl"
    wl.mkdir()
    make_checkpoint(wl / "ck", tokenizer=True)  # a WordLevel tokenizer
    msg = one_line_error(export(str(wl / "ck"), str(tmp_path / "x.gguf"), "--format", "gguf"))
    assert "WordLevel" in msg and "gpt2" in msg
    bare = tmp_path / "bare"
    bare.mkdir()
    make_checkpoint(bare / "ck")
    msg = one_line_error(export(str(bare / "ck"), str(tmp_path / "x.gguf"), "--format", "gguf"))
    assert "tokenizer.json" in msg
    msg = one_line_error(export(str(bpe_ck), str(tmp_path / "hf"), "--quantize", "q8_0"))
    assert "--format gguf" in msg
    assert not (tmp_path / "x.gguf").exists() and leftovers(tmp_path, "x.gguf") == []


def test_llama_cpp_greedy_tokens_equal_astrai(tmp_path, bpe_ck):
    """llama.cpp (llama-cpp-python) runs the f32 export: its greedy continuation and its
    tokenization equal astrai's."""
    llama_cpp = llama_cpp_or_skip()
    from astrai.data.tokenizer import Tokenizer
    from astrai.model.hf import load_pretrained

    out = tmp_path / "m.gguf"
    assert export(str(bpe_ck), str(out), "--format", "gguf", "--dtype", "float32").exit_code == 0
    tok = Tokenizer.load(bpe_ck)
    text = "one two three 7 four"
    ids = tok.encode(text, add_special_tokens=True)
    llm = llama_cpp.Llama(model_path=str(out), n_ctx=128, n_threads=1, verbose=False,
                          type_k=0, type_v=0)  # an f32 KV cache (llama.cpp's default: f16)
    assert llm.tokenize(text.encode(), add_bos=True, special=False) == ids
    model, _, _ = load_pretrained(bpe_ck, dtype=torch.float32)
    ours, seq = [], list(ids)
    with torch.no_grad():
        for _ in range(16):
            nxt = int(model(torch.tensor([seq])).logits[0, -1].argmax())
            ours.append(nxt)
            seq.append(nxt)
    theirs = []
    for t in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        theirs.append(t)
        if len(theirs) == 16:
            break
    assert theirs == ours and len(set(ours)) > 3  # a continuation, not one repeated token


def test_llama_cpp_parses_and_prints_special_tokens_as_astrai(tmp_path, bpe_ck):
    """A chat-template rendering with special and added tokens, tokenized by llama.cpp with
    special-token parsing, gives astrai's ids; llama.cpp prints control tokens only when
    asked for special tokens (`<|fim_prefix|>`, not flagged special in tokenizer.json but
    control as llama.cpp's converter types it) and user-defined ones (`<think>`) always."""
    llama_cpp = llama_cpp_or_skip()
    from astrai.data.tokenizer import Tokenizer

    tok_dir = with_added_tokens(bpe_ck, tmp_path / "tok")
    config = small_config(vocab_size=320, dim=32, ffn_dim=32, n_layers=1)
    save_checkpoint(tmp_path / "ck", random_model(config), config, tokenizer_dir=tok_dir,
                    meta={"step": 1})
    out = tmp_path / "m.gguf"
    assert export(str(tmp_path / "ck"), str(out), "--format", "gguf").exit_code == 0
    tok = Tokenizer.load(tmp_path / "ck")
    text = tok.render_chat([
        {"role": "system", "content": "one two"},
        {"role": "user", "content": "three<think> four</think><|tool|>five<｜tool▁sep｜>"},
        {"role": "assistant", "content": "<|fim_prefix|>six [ctrl] seven"},
    ], add_generation_prompt=True)
    ids = tok.encode(text)
    llm = llama_cpp.Llama(model_path=str(out), vocab_only=True, verbose=False)
    assert llm.tokenize(text.encode(), add_bos=False, special=True) == ids
    assert {tok.id_to_token(i) for i in ids} >= {"<|bos|>", "<|im_start|>", "<|im_end|>",
                                                "<think>", "<|tool|>", "<｜tool▁sep｜>",
                                                "<|fim_prefix|>", "[ctrl]"}
    shown = {t: (llm.detokenize([tok.token_to_id(t)], special=False),
                 llm.detokenize([tok.token_to_id(t)], special=True))
             for t in ("<|im_end|>", "<|fim_prefix|>", "<｜tool▁sep｜>", "<think>")}
    assert shown == {"<|im_end|>": (b"", b"<|im_end|>"),
                     "<|fim_prefix|>": (b"", b"<|fim_prefix|>"),
                     "<｜tool▁sep｜>": (b"", "<｜tool▁sep｜>".encode()),
                     "<think>": (b"<think>", b"<think>")}


def test_q4_0_export_holds_astrais_int4_weights(tmp_path, bpe_ck):
    """`--quantize q4_0`: every 2-D weight's blocks are the bytes of astrai's int4 layer of
    the same weight (one rule, one layout). llama.cpp running such a file:
    tests/infer/test_int4_inference.py."""
    from astrai.infer import Engine
    from astrai.model.gguf_names import gguf_name
    from astrai.model.quant4 import Int4Linear

    out = tmp_path / "m.gguf"
    res = export(str(bpe_ck), str(out), "--format", "gguf", "--quantize", "q4_0")
    assert res.exit_code == 0, res.output
    r = gguf.GGUFReader(out)
    assert r.get_field("general.file_type").contents() == gguf.LlamaFileType.MOSTLY_Q4_0
    tensors = {t.name: t for t in r.tensors}
    eng = Engine.from_checkpoint(bpe_ck, device="cpu", quantize="int4")
    for name in ("layers.0.mlp.down_proj", "layers.1.attn.v_proj"):  # no row permutation
        layer = eng.model.get_submodule(name)
        assert isinstance(layer, Int4Linear)
        t = tensors[gguf_name(f"{name}.weight")]
        assert t.tensor_type == gguf.GGMLQuantizationType.Q4_0
        blocks = torch.from_numpy(np.array(t.data, copy=True)).view(torch.uint8)
        blocks = blocks.reshape(layer.out_features, -1, 18)
        state = layer.state_dict()  # the row layout, whatever the engine's kernels took
        assert torch.equal(blocks[..., 2:].reshape(layer.out_features, -1), state["qweight"])
        scales = blocks[..., :2].contiguous().view(torch.float16).float().squeeze(-1)
        assert torch.equal(scales, state["scale"])
