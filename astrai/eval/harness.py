"""The `astrai` model of lm-evaluation-harness (imports lm_eval; install `astrai[eval]`).

    import astrai.eval.harness                       # registers the name "astrai"
    lm_eval.simple_evaluate(model="astrai", model_args="pretrained=CKPT", tasks=[...])

The three request types of lm-eval's `LM` interface:
  * `loglikelihood` (via TemplateLM's tokenization) and `loglikelihood_rolling`: the
    prefix-tree batched `Scorer` over the model's forward (astrai/eval/score.py);
  * `generate_until`: the inference `Engine` (continuous batching, radix prefix cache),
    with lm-eval's stop sequences as the engine's stop strings.
Tokenization, truncation and prefix-token choices follow lm-eval's `HFLM`, so the numbers
equal the `hf` model's on the exported HF directory of the same checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs

from astrai.errors import CheckpointError
from astrai.eval.score import Scorer
from astrai.infer import CacheConfig, Engine, SamplingParams
from astrai.infer.build import EngineOptions, build_engine, load_weights
from astrai.infer.loading import load_tokenizer


def render_chat(tokenizer: Any, messages: list[dict], add_generation_prompt: bool) -> str:
    """The chat template's text for `messages` (the one seam to the tokenizer's chat path)."""
    return tokenizer.render_chat(messages, add_generation_prompt=add_generation_prompt)


@register_model("astrai")
class AstraiLM(TemplateLM):
    def __init__(self, pretrained: str | None = None, device: str | None = "auto",
                 dtype: str | None = None, max_length: int | None = None,
                 max_gen_toks: int = 256, batch_tokens: int = 1024, max_requests: int = 32,
                 seed: int = 0, *, model: Any = None, tok: Any = None,
                 adapter: str | None = None, quantize: str | None = None,
                 decode: str = "auto", **_: Any) -> None:
        """`pretrained`: an astrai checkpoint or HF Llama/Qwen2/Mistral directory with a
        tokenizer.json (or pass `model` and `tok` objects); `adapter`: a PEFT LoRA
        directory merged in (default: a LoRA checkpoint's own); `quantize`: 'int8'
        weights; `decode`: how generation's decode steps run (astrai.infer.decode_step).
        lm-eval's batch_size /
        max_batch_size are accepted and ignored: batches are sized in tokens."""
        super().__init__()
        self.options = EngineOptions(device=device or "auto", dtype=dtype, adapter=adapter,
                                     quantize=quantize, decode=decode, seed=int(seed))
        if model is None:
            if pretrained is None:
                raise ValueError("model_args needs pretrained=CHECKPOINT_DIR")
            model = load_weights(pretrained, self.options)
            tok = load_tokenizer(pretrained)
            if tok is None:
                raise CheckpointError(f"{pretrained} has no tokenizer.json: lm-eval tasks are "
                                      "text; copy the tokenizer the model was trained with "
                                      "into it")
        self.model, self.tok = model, tok
        self.name = str(pretrained or "astrai")
        self.max_length = int(max_length or model.config.max_seq_len)
        self.max_gen_toks = int(max_gen_toks)
        self.seed = int(seed)
        self.decode = decode
        self.scorer = Scorer(model, self.max_length, int(batch_tokens))
        page = 16
        self._cache = CacheConfig(page_size=page, max_requests=int(max_requests),
                                  max_kv_tokens=int(max_requests) * (self.max_length + page),
                                  max_context=self.max_length)
        self._engine: Engine | None = None

    @property
    def engine(self) -> Engine:
        """The inference engine, built on first generation."""
        if self._engine is None:
            # huge_pages off: the scorer holds the same module
            self._engine = build_engine(self.model, self.tok, self.options, self._cache,
                                        huge_pages=False)
        return self._engine

    # -- tokens ----------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.tok.eos_id

    @property
    def prefix_token_id(self) -> int:
        # HFLM: BOS when the tokenizer has one, else EOT
        bos = self.tok.bos_id
        return bos if bos is not None else self.eot_token_id

    def tok_encode(self, string: str, add_special_tokens: bool | None = None,
                   **kwargs: Any) -> list[int]:
        # HFLM: None = the tokenizer's post-processor (e.g. BOS), unless the text already
        # starts with the BOS text (a chat template wrote it)
        if add_special_tokens is None:
            bos = self.tok.bos_token
            add_special_tokens = not (bos and string.startswith(bos))
        return self.tok.encode(string, add_special_tokens=add_special_tokens)

    @property
    def tokenizer_name(self) -> str:
        return Path(self.name).name.replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.tok.chat_template if chat_template else None

    def apply_chat_template(self, chat_history: list[dict[str, str]],
                            add_generation_prompt: bool = True) -> str:
        return render_chat(self.tok, chat_history, add_generation_prompt)

    # -- requests --------------------------------------------------------------------------
    def _loglikelihood_tokens(self, requests: list, disable_tqdm: bool = False,
                              **kwargs: Any) -> list[tuple[float, bool]]:
        return self.scorer.loglikelihood([(ctx, cont) for _, ctx, cont in requests])

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        docs = [self.tok_encode(req.args[0]) for req in requests]
        return self.scorer.rolling(docs, self.prefix_token_id)

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        eos = self.tok.decode([self.eot_token_id], skip_special_tokens=False)
        prompts, params = [], []
        for i, req in enumerate(requests):
            context, gen_kwargs = req.args
            kw = normalize_gen_kwargs(dict(gen_kwargs), self.max_gen_toks)
            until = handle_stop_sequences(kw.pop("until", None), eos=eos)
            n = int(kw.pop("max_gen_toks"))
            room = self.max_length - n
            if room < 1:
                raise ValueError(f"max_gen_toks={n} leaves no room for the prompt in the "
                                 f"context of {self.max_length} tokens")
            prompts.append(self.tok_encode(context)[-room:])  # HFLM keeps the last tokens
            sample = bool(kw.get("do_sample")) and float(kw.get("temperature") or 0) > 0
            params.append(SamplingParams(
                max_tokens=n, stop=[s for s in until if s],
                temperature=float(kw["temperature"]) if sample else 0.0,
                top_p=float(kw.get("top_p") or 1.0) if sample else 1.0,
                top_k=int(kw.get("top_k") or 0) if sample else 0,
                seed=self.seed + i if sample else None))
        return [out.text for out in self.engine.generate(prompts, params)]
