"""Local lm-eval tasks (YAML + JSONL written here; no hub) run end to end through lm-eval's
`simple_evaluate(model="astrai")` and `astrai eval --tasks`, against lm-eval's `hf` model on
the exported twin: identical acc / acc_norm / exact_match, per-item log-likelihoods within
1e-4."""

import json

import pytest
from typer.testing import CliRunner

lm_eval = pytest.importorskip("lm_eval")
import astrai.eval.harness  # noqa: F401  (registers "astrai")
from astrai_cli.main import app

QUESTIONS = [
    ("Friends, Romans,", [" countrymen", " friends", " Caesar"], 0),
    ("To be, or not to be:", [" that is", " the question", " a name"], 1),
    ("O Romeo, Romeo!", [" wherefore", " art thou", " Juliet"], 0),
    ("Now is the winter", [" of our", " discontent", " made glorious"], 2),
    ("All the world's", [" a stage", " men and women", " players"], 0),
    ("Double, double", [" toil and", " trouble", " fire burn"], 1),
]
PROMPTS = ["Friends, Romans,", "To be or", "O Romeo", "The king", "Now is the", "All the"]


def write_tasks(root, gen_targets):
    root.mkdir(parents=True, exist_ok=True)
    mc = root / "mc.jsonl"
    mc.write_text("\n".join(json.dumps({"question": q, "choices": c, "answer": a})
                            for q, c, a in QUESTIONS) + "\n")
    gen = root / "gen.jsonl"
    gen.write_text("\n".join(json.dumps({"prompt": p, "target": t})
                             for p, t in zip(PROMPTS, gen_targets)) + "\n")
    (root / "astrai_mc.yaml").write_text(f"""task: astrai_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {mc}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
""")
    (root / "astrai_gen.yaml").write_text(f"""task: astrai_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {gen}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{target}}}}"
generation_kwargs:
  until: ["e", "\\n"]
  max_gen_toks: 6
  do_sample: false
metric_list:
  - metric: exact_match
""")
    return root


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory, ckpt):
    from lm_eval.api.instance import Instance

    from astrai.eval.harness import AstraiLM

    # half the targets are the model's own greedy answer, so exact_match is neither 0 nor 1
    lm = AstraiLM(str(ckpt), device="cpu")
    gen = {"until": ["e", "\n"], "max_gen_toks": 6, "do_sample": False}
    own = lm.generate_until([Instance("generate_until", {}, (p, gen), 0) for p in PROMPTS])
    targets = [o if i % 2 == 0 else o + "x" for i, o in enumerate(own)]
    return write_tasks(tmp_path_factory.mktemp("tasks"), targets)


def evaluate(model, model_args, task_dir, **kw):
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(
        model=model, model_args=model_args, tasks=["astrai_mc", "astrai_gen"],
        task_manager=TaskManager(include_path=str(task_dir)), log_samples=True,
        random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0, **kw)


@pytest.fixture(scope="module")
def hf_results(hf_dir, task_dir):
    return evaluate("hf", f"pretrained={hf_dir},dtype=float32,device=cpu", task_dir)


def metrics(res, task):
    return {k: v for k, v in res["results"][task].items() if "stderr" not in k and k != "alias"}


def test_simple_evaluate_equals_hflm(ckpt, task_dir, hf_results):
    ours = evaluate("astrai", f"pretrained={ckpt},device=cpu", task_dir)
    for task in ("astrai_mc", "astrai_gen"):
        assert metrics(ours, task) == metrics(hf_results, task)
    assert 0 < ours["results"]["astrai_gen"]["exact_match,none"] < 1
    a, b = ours["samples"]["astrai_mc"], hf_results["samples"]["astrai_mc"]
    for x, y in zip(a, b, strict=True):
        for ((lp, g),), ((rlp, rg),) in zip(x["resps"], y["resps"], strict=True):
            assert lp == pytest.approx(rlp, abs=1e-4) and g == rg
    assert [s["resps"] for s in ours["samples"]["astrai_gen"]] == \
        [s["resps"] for s in hf_results["samples"]["astrai_gen"]]


def test_cli_tasks_table_and_json(tmp_path, ckpt, hf_dir, task_dir):
    out = tmp_path / "res.json"
    r = CliRunner().invoke(app, ["eval", str(ckpt), "--tasks", "astrai_mc,astrai_gen",
                                 "--include-path", str(task_dir), "--device", "cpu",
                                 "--out", str(out), "--limit", "4", "--num-fewshot", "1"])
    assert r.exit_code == 0, r.output
    assert "astrai_mc" in r.output and "acc_norm" in r.output
    got = json.loads(out.read_text())
    assert got["n-shot"] == {"astrai_mc": 1, "astrai_gen": 1}
    assert {row["metric"] for row in got["rows"]} == {"acc", "acc_norm", "exact_match"}
    # the same run (4 examples, one-shot) through lm-eval's hf model
    ref = evaluate("hf", f"pretrained={hf_dir},dtype=float32,device=cpu", task_dir, limit=4,
                   num_fewshot=1)
    for task in ("astrai_mc", "astrai_gen"):
        assert {k: v for k, v in got["results"][task].items() if "stderr" not in k} == \
            {k: v for k, v in ref["results"][task].items() if "stderr" not in k}


def test_unknown_task_is_one_line(ckpt, task_dir):
    r = CliRunner().invoke(app, ["eval", str(ckpt), "--tasks", "no_such_task",
                                 "--include-path", str(task_dir), "--device", "cpu"])
    assert r.exit_code == 2 and "unknown task no_such_task" in r.output


def test_lm_eval_command_line_with_the_astrai_model(tmp_path, ckpt, task_dir):
    """lm-eval's own CLI (`python -m astrai.eval.lm_eval_main` registers the model first)."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "astrai.eval.lm_eval_main", "--model", "astrai", "--model_args",
         f"pretrained={ckpt}", "--device", "cpu", "--tasks", "astrai_mc", "--include_path",
         str(task_dir), "--output_path", str(tmp_path / "out")],
        check=False, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "astrai_mc" in r.stdout and "acc_norm" in r.stdout


def test_chat_template_runs_equal_hflm(ckpt, hf_dir, task_dir):
    """--apply-chat-template: lm-eval renders the turns with our template (HFLM with the
    exported chat_template.jinja); the per-item log-likelihoods agree."""
    kw = {"apply_chat_template": True, "limit": 3}
    ours = evaluate("astrai", f"pretrained={ckpt},device=cpu", task_dir, **kw)
    ref = evaluate("hf", f"pretrained={hf_dir},dtype=float32,device=cpu", task_dir, **kw)
    assert "<|im_start|>" in str(ours["samples"]["astrai_mc"][0]["arguments"])
    for task in ("astrai_mc", "astrai_gen"):
        assert metrics(ours, task) == metrics(ref, task)
    for x, y in zip(ours["samples"]["astrai_mc"], ref["samples"]["astrai_mc"], strict=True):
        assert x["arguments"] == y["arguments"]
        for ((lp, g),), ((rlp, rg),) in zip(x["resps"], y["resps"], strict=True):
            assert lp == pytest.approx(rlp, abs=1e-4) and g == rg
