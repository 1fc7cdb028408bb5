"""SamplingParams: how one request is decoded and when it stops (validated)."""

from __future__ import annotations

from dataclasses import dataclass, field

from astrai.errors import ConfigError


@dataclass
class SamplingParams:
    """Per-request decoding settings (OpenAI / vLLM names and semantics)."""

    max_tokens: int = 256
    """Most tokens to generate; the context length also stops a request ("length")."""
    temperature: float = 1.0
    """Softmax temperature; 0 = greedy (argmax)."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 (or -1) = off."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens with probability mass >= top_p."""
    min_p: float = 0.0
    """Drop tokens less likely than min_p times the most likely one; 0 = off."""
    repetition_penalty: float = 1.0
    """CTRL penalty on prompt and output tokens: logit / p if positive else logit * p."""
    frequency_penalty: float = 0.0
    """Subtract penalty * count of each token in the output so far."""
    presence_penalty: float = 0.0
    """Subtract penalty from every token already in the output."""
    seed: int | None = None
    """Per-request seed: the same seed gives the same tokens whatever else is batched."""
    stop: list[str] = field(default_factory=list)
    """Stop strings (may span tokens); the text ends before them."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Extra token ids that end the request (kept in token_ids, not in text)."""
    ignore_eos: bool = False
    """Keep generating past the tokenizer's EOS / stop tokens (benchmarks)."""
    include_stop_str_in_output: bool = False
    """Keep the matched stop string at the end of the text."""
    logprobs: bool = False
    """Return each generated token's log-probability under the raw model distribution."""
    top_logprobs: int = 0
    """Also return the n most likely tokens and their log-probabilities per step."""

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.validate()

    @classmethod
    def greedy(cls, max_tokens: int = 256, **kw) -> SamplingParams:
        return cls(max_tokens=max_tokens, temperature=0.0, **kw)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0)

    def validate(self) -> None:
        def bad(name: str, why: str) -> ConfigError:
            return ConfigError(f"sampling {name}={getattr(self, name)!r}: {why}")

        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise bad("max_tokens", "must be an integer >= 1")
        if not self.temperature >= 0:
            raise bad("temperature", "must be >= 0 (0 = greedy)")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise bad("top_k", "must be an integer >= 0 (0 or -1 = off)")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "must be in (0, 1]")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "must be in [0, 1]")
        if not self.repetition_penalty > 0:
            raise bad("repetition_penalty", "must be > 0 (1 = off)")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise bad(name, "must be in [-2, 2]")
        if self.seed is not None and not isinstance(self.seed, int):
            raise bad("seed", "must be an integer or None")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop", "stop strings must be non-empty strings")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "must be token ids >= 0")
        if not 0 <= self.top_logprobs <= 20:
            raise bad("top_logprobs", "must be in [0, 20]")
