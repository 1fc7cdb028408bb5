"""`astrai eval`: the --data table and --json file, and one-line errors (exit 2)."""

import json
import shutil

import pytest
from typer.testing import CliRunner

from astrai.data.testing import tiny_tokenizer
from astrai.eval.perplexity import evaluate_perplexity
from astrai.model import build_model, get_preset
from astrai.model.checkpoint import save_checkpoint
from astrai_cli.main import app

runner = CliRunner()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    tok = tiny_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=512)
    cfg = get_preset("tiny", vocab_size=512, dim=32, n_layers=1, n_heads=2, n_kv_heads=1,
                     head_dim=16, ffn_dim=64, max_seq_len=32)
    model = build_model(cfg, seed=0)
    return save_checkpoint(tmp_path_factory.mktemp("ck") / "ckpt", model, cfg,
                           tokenizer_dir=tok.path)


@pytest.fixture
def held(tmp_path):
    f = tmp_path / "held.jsonl"
    f.write_text(json.dumps({"text": "Friends, Romans, countrymen, lend me your ears. " * 3})
                 + "\n" + json.dumps({"text": "To be, or not to be."}) + "\n")
    return f


def test_data_table_and_json(tmp_path, ckpt, held, one_thread):
    out = tmp_path / "r.json"
    r = runner.invoke(app, ["eval", str(ckpt), "--data", str(held), "--device", "cpu",
                            "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "bpb" in r.output and "ppl" in r.output
    got = json.loads(out.read_text())
    ref = evaluate_perplexity(ckpt, held, device="cpu")
    assert got["bpb"] == pytest.approx(ref.bpb) and got["documents"] == 2
    r2 = runner.invoke(app, ["eval", str(ckpt), "--data", str(held), "--device", "cpu",
                             "--json"])
    assert r2.exit_code == 0 and json.loads(r2.stdout) == got  # --json: JSON on stdout
    r = runner.invoke(app, ["eval", str(ckpt), "--data", str(held), "--device", "cpu",
                            "--metric", "bpb"])
    assert r.exit_code == 0 and "ppl" not in r.output


@pytest.mark.parametrize("args, message", [
    ([], "give --data"),
    (["--data", "x.jsonl", "--tasks", "arc_easy"], "not both"),
    (["--data", "{held}", "--metric", "acc"], "--metric acc"),
    (["--data", "{tmp}/none.jsonl"], "no such file"),
    (["--data", "{held}", "--batch-tokens", "0"], "--batch-tokens"),
    (["--data", "{held}", "--limit", "-1"], "--limit -1: with --data it counts documents"),
    (["--data", "{held}", "--limit", "0.5"], "--limit 0.5: with --data it counts documents"),
    (["--tasks", "arc_easy", "--limit", "-1"], "--limit -1: give a count of examples"),
    (["--tasks", "arc_easy", "--limit", "0"], "--limit 0: give a count of examples"),
])
def test_mistakes_are_one_line(tmp_path, ckpt, held, args, message):
    args = [a.format(held=held, tmp=tmp_path) for a in args]
    r = runner.invoke(app, ["eval", str(ckpt), "--device", "cpu", *args])
    assert r.exit_code == 2 and message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not r.stdout, r.output


def test_a_run_directory_stands_for_its_newest_checkpoint(tmp_path, ckpt, held, one_thread):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(ckpt, run / "checkpoints" / "step_3")
    r = runner.invoke(app, ["eval", str(run), "--data", str(held), "--device", "cpu",
                            "--json"])
    assert r.exit_code == 0, r.output
    assert "using its newest checkpoint" in r.stderr
    assert json.loads(r.stdout)["bpb"] == pytest.approx(
        evaluate_perplexity(ckpt, held, device="cpu").bpb)


@pytest.mark.parametrize("mode", [["--data", "{held}"], ["--tasks", "arc_easy"]])
def test_a_directory_that_is_no_checkpoint_says_what_was_expected(tmp_path, held, mode):
    if "--tasks" in mode:
        pytest.importorskip("lm_eval")
    (tmp_path / "notes").mkdir()
    mode = [a.format(held=held) for a in mode]
    r = runner.invoke(app, ["eval", str(tmp_path / "notes"), *mode, "--device", "cpu"])
    assert r.exit_code == 2, r.output
    line = r.stderr.strip()
    assert "not a checkpoint (no config.json); expected an astrai checkpoint" in line
    assert "Hugging Face model directory" in line and "copy" not in line


def test_without_lm_eval_says_how_to_install(monkeypatch, ckpt):
    from astrai.eval import tasks

    monkeypatch.setattr(tasks.importlib.util, "find_spec",
                        lambda name: None if name == "lm_eval" else object())
    r = runner.invoke(app, ["eval", str(ckpt), "--tasks", "arc_easy"])
    assert r.exit_code == 2
    assert "pip install 'astrai[eval]'" in r.output and len(r.output.strip().splitlines()) == 1


def test_quantize_int8_scores_and_an_unknown_format_is_one_line(ckpt, held, one_thread):
    r = runner.invoke(app, ["eval", str(ckpt), "--data", str(held), "--device", "cpu",
                            "--quantize", "int8", "--json"])
    assert r.exit_code == 0, r.output
    ref = evaluate_perplexity(ckpt, held, device="cpu")
    assert json.loads(r.stdout)["bpb"] == pytest.approx(ref.bpb, rel=0.01)
    r = runner.invoke(app, ["eval", str(ckpt), "--data", str(held), "--device", "cpu",
                            "--quantize", "int3"])
    assert r.exit_code == 2 and "--quantize 'int3': use none or int8, int4" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not r.stdout


def test_quantize_int8_scores_the_int8_model(ckpt, held, one_thread, monkeypatch):
    """`eval --quantize int8` scores the int8 model: its bits per byte are those of the fp32
    weights quantized here by hand (`quantize_model`), away from fp32's by a measured margin
    far above fp32 noise. A flag validated but not applied scores the fp32 model and fails."""
    from astrai.infer import loading
    from astrai.model.quant import quantize_model

    r = runner.invoke(app, ["eval", str(ckpt), "--data", str(held), "--device", "cpu",
                            "--quantize", "int8", "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)["bpb"]
    fp32 = evaluate_perplexity(ckpt, held, device="cpu").bpb
    plain = loading.load_model

    def by_hand(*a, quantize=None, **k):
        model = plain(*a, **k)
        assert all(type(m).__name__ != "Int8Linear" for m in model.modules())
        return quantize_model(model, "int8")

    monkeypatch.setattr(loading, "load_model", by_hand)
    int8 = evaluate_perplexity(ckpt, held, device="cpu").bpb
    # measured: int8 5.21700 against fp32 5.21712 bpb (2.4e-5 apart, relative); the same
    # computation twice agrees to the last bit, a different batching to ~1e-7
    assert got == pytest.approx(int8, rel=1e-6, abs=0)
    assert abs(int8 - fp32) > 5e-6 * fp32
