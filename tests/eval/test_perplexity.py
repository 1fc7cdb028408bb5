"""Bits per byte and perplexity: against an HF model's loss on the same text, and equal to
what training's validation reports for the same dataset and checkpoint."""

import json
import math
from pathlib import Path

import pytest
import torch

from astrai.data.testing import tiny_dataset
from astrai.errors import DataError
from astrai.eval.perplexity import evaluate_perplexity, score_documents

DOCS = ["Friends, Romans, countrymen, lend me your ears.",
        "To be, or not to be: that is the question. Ünïcödé too: café.",
        "O Romeo, Romeo! wherefore art thou Romeo? " * 6]  # > 64 tokens: rolling windows


def test_bpb_equals_hf_loss_on_the_same_text(model, tok, hf_dir):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    res = score_documents(model, tok, DOCS[:2])
    nll = 0.0
    for d in DOCS[:2]:
        ids = [tok.bos_id] + tok.encode(d)  # the first token is predicted from BOS
        with torch.no_grad():
            loss = hf(torch.tensor([ids]), labels=torch.tensor([ids])).loss
        nll += float(loss) * (len(ids) - 1)
    nbytes = sum(len(d.encode()) for d in DOCS[:2])
    assert res.bytes == nbytes and res.tokens == sum(len(tok.encode(d)) for d in DOCS[:2])
    assert res.nll == pytest.approx(nll, rel=1e-5)
    assert res.bpb == pytest.approx(nll / math.log(2) / nbytes, rel=1e-5)
    assert res.ppl == pytest.approx(math.exp(nll / res.tokens), rel=1e-5)


def test_jsonl_text_and_chat_records(tmp_path, ckpt, model, tok):
    chat = [{"role": "user", "content": "Who art thou?"}, {"role": "assistant",
                                                            "content": "Romeo."}]
    f = tmp_path / "held.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in
                           [{"text": DOCS[0]}, {"text": DOCS[2]}, {"messages": chat}]) + "\n")
    got = evaluate_perplexity(ckpt, f, device="cpu")
    ref = score_documents(model, tok, [DOCS[0], DOCS[2],
                                       tok.render_chat(chat, add_generation_prompt=False)])
    assert got.documents == 3 and got.nll == pytest.approx(ref.nll, rel=1e-6)
    assert got.bpb == pytest.approx(ref.bpb, rel=1e-6)
    assert evaluate_perplexity(ckpt, f, device="cpu", limit=1).documents == 1


def test_bad_inputs_name_the_file(tmp_path, ckpt):
    with pytest.raises(DataError, match="no such file"):
        evaluate_perplexity(ckpt, tmp_path / "none.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"other": 1}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: missing field 'text'"):
        evaluate_perplexity(ckpt, bad, device="cpu")
    with pytest.raises(DataError, match="manifest.json"):
        evaluate_perplexity(ckpt, tmp_path, device="cpu")


def test_dataset_dir_equals_training_validation(tmp_path, one_thread):
    from astrai.config.train import TrainConfig
    from astrai.train import train

    ds = tiny_dataset(tmp_path / "data", "pretrain", n=16, n_val=6, max_seq_len=32)
    cfg = TrainConfig(strategy="seq", model="tiny", data=str(ds), out=str(tmp_path / "run"),
                      model_overrides={"dim": 32, "n_layers": 1, "n_heads": 2,
                                       "n_kv_heads": 1, "head_dim": 16, "ffn_dim": 64},
                      batch_size=4, max_steps=2, eval_interval=2, ckpt_interval=2,
                      max_lr=1e-2, warmup_steps=1, device="cpu", peak_tflops=1.0)
    s = train(cfg)
    last = [json.loads(x) for x in
            (Path(s.run_dir) / "metrics.jsonl").read_text().splitlines()][-1]
    got = evaluate_perplexity(s.checkpoint, ds, device="cpu", batch_size=3)
    assert got.documents > 1 and got.bytes > 0  # val rows, over several batches of 3
    assert got.bpb == pytest.approx(last["val_bpb"], rel=1e-6)
    assert got.ppl == pytest.approx(last["val_ppl"], rel=1e-6)
