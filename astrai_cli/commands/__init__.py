"""The command table: each `astrai` command, the module that defines it, the one line that
lists it (`astrai --help`, zsh/fish completion) and the example ending its `--help`.

A command's module is imported only when that command runs, completes or shows its help,
so `astrai --help` and TAB stay fast (no torch, no pydantic model building).
"""

from __future__ import annotations

# name -> (module under astrai_cli.commands, one-line summary); in `astrai --help` order.
COMMANDS: dict[str, tuple[str, str]] = {
    "quickstart": ("quickstart_cmd", ("Start here: tokenizer, data, training, bits per byte "
                                      "and a sample in minutes.")),
    "info": ("info_cmd", ("Show a model's config, parameters by component, FLOPs per token "
                          "and weight memory.")),
    "export": ("export_cmd", ("Export a checkpoint to Hugging Face format or to GGUF "
                              "(llama.cpp, ollama).")),
    "kernels": ("kernels_cmd", ("Report the CUDA kernels: built or not, for which GPUs, "
                                "and why not.")),
    "tokenizer": ("tokenizer_cmd", "Train and inspect byte-level BPE tokenizers."),
    "preprocess": ("preprocess_cmd", ("Tokenize, mask, pack and shard JSONL records as the "
                                      "spec says.")),
    "inspect-weights": ("inspect_cmd", "Find BF16 lock-in, overflow and stuck weights."),
    "chat": ("chat_cmd", ("Chat with a model: streamed replies, /set, /system, /reset, "
                          "/stats, /exit.")),
    "eval": ("eval_cmd", ("Bits per byte / perplexity on held-out data, or "
                          "lm-evaluation-harness tasks.")),
    "serve": ("serve_cmd", ("Serve a model over the OpenAI API: chat/completions "
                            "(streaming), models, metrics.")),
    "serve-bench": ("serve_bench_cmd", ("Benchmark serving: TTFT, TPOT, ITL, latency, "
                                        "throughput, prefix hits, KV usage.")),
    "train": ("train_cmd", ("Train a model: a dataset directory + a preset/config/checkpoint "
                            "-> a run directory.")),
    "resume": ("resume_cmd", ("Continue a run from its newest complete checkpoint, as if "
                              "never interrupted.")),
    "convert-checkpoint": ("convert_cmd", ("Convert a checkpoint between DCP shards and "
                                           "model.safetensors, both ways.")),
    "plot": ("plot_cmd", ("Plot training curves (loss, validation bits per byte, lr, ...) "
                          "from metrics.jsonl.")),
}

# command path (after `astrai`) -> the example that ends its --help; every command and
# subcommand has one, each line short enough not to wrap at 80 columns (tests/cli/test_help.py).
EXAMPLES: dict[str, list[str]] = {
    "": ["astrai quickstart", "astrai train --help"],
    "quickstart": ["astrai quickstart --out runs/quickstart"],
    "info": ["astrai info tiny"],
    "export": ["astrai export runs/sft hf/sft --format hf",
               "astrai export runs/sft sft.gguf --format gguf --quantize q8_0"],
    "kernels": ["astrai kernels"],
    "tokenizer": ["astrai tokenizer train corpus.jsonl --vocab-size 4096 --out runs/tokenizer"],
    "tokenizer train": [("astrai tokenizer train corpus.jsonl --vocab-size 4096 "
                         "--out runs/tokenizer")],
    "tokenizer encode": ["astrai tokenizer encode runs/tokenizer 'Hello, world'"],
    "tokenizer info": ["astrai tokenizer info runs/tokenizer"],
    "preprocess": ["astrai preprocess examples/specs/pretrain.json",
                   "astrai preprocess merge runs/data/s0 runs/data/s1 --out runs/data/all"],
    "preprocess merge": [("astrai preprocess merge runs/data/s0 runs/data/s1 "
                         "--out runs/data/all")],
    "inspect-weights": ["astrai inspect-weights runs/pretrain"],
    "chat": ["astrai chat runs/sft --prompt 'Name three rivers.' --temperature 0"],
    "eval": ["astrai eval runs/pretrain --data held_out.jsonl"],
    "serve": ["astrai serve runs/sft --port 8000 --api-key KEY"],
    "serve-bench": ["astrai serve-bench tiny --request-rate 8 --max-concurrency 16"],
    "train": ["astrai train --data runs/data/pretrain --model tiny --out runs/pretrain",
              "astrai train --strategy sft --data runs/data/sft --model runs/pretrain"],
    "resume": ["astrai resume runs/pretrain"],
    "convert-checkpoint": [("astrai convert-checkpoint runs/x/checkpoints/step_100 "
                            "step_100-full")],
    "plot": ["astrai plot runs/pretrain runs/other --out curves.png"],
}
