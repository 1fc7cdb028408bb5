"""Training a byte-level BPE tokenizer (`astrai tokenizer train`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from astrai.data.chat import CHAT_MARKERS, DEFAULT_CHAT_TEMPLATE, compile_template
from astrai.data.records import expand_inputs, iter_texts
from astrai.data.tokenizer import Tokenizer
from astrai.errors import ConfigError, DataError


@dataclass
class SpecialTokens:
    """Special tokens a trained tokenizer gets; ids follow this order from 0."""

    bos: str = "<|bos|>"
    """Begins every document and conversation."""
    eos: str = "<|endoftext|>"
    """Ends a pretraining document; also a stop token."""
    pad: str = "<|pad|>"
    """Fills batches; never trained on."""
    extra: Sequence[str] = field(default_factory=lambda: list(CHAT_MARKERS))
    """More special tokens: the chat role markers of the default template, tool tags, ..."""

    def all(self) -> list[str]:
        out: list[str] = []
        for t in (self.bos, self.eos, self.pad, *self.extra):
            if t and t not in out:
                out.append(t)
        return out


def train_tokenizer(
    files: Sequence[str | Path],
    vocab_size: int,
    out_dir: str | Path | None,
    field: str = "text",
    special_tokens: SpecialTokens | None = None,
    *,
    min_frequency: int = 2,
    chat_template: str | None = None,
    model_max_length: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> Tokenizer:
    """Train byte-level BPE on `files` (JSONL `field`, or plain text lines); save to out_dir.

    Every byte is in the initial alphabet, so any text encodes with no unknown token.
    `progress(n_texts)` is called every 1000 texts read.
    """
    special = special_tokens or SpecialTokens()
    names = special.all()
    floor = 256 + len(names)
    if vocab_size < floor:
        raise ConfigError(f"vocab_size {vocab_size} is below {floor} (256 bytes + "
                          f"{len(names)} special tokens); choose a larger --vocab-size")
    template = chat_template or DEFAULT_CHAT_TEMPLATE
    compile_template(template)  # a syntax error fails before training
    paths = expand_inputs(files, "tokenizer inputs")

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=names,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    count = 0

    def texts():
        nonlocal count
        for t in iter_texts(paths, field):
            count += 1
            if progress and count % 1000 == 0:
                progress(count)
            yield t

    tok.train_from_iterator(texts(), trainer=trainer)
    if count == 0:
        raise DataError(f"tokenizer inputs: no text in {', '.join(map(str, paths))}")
    # `encode(..., add_special_tokens=True)` prepends BOS, as HF tokenizers of this family do.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{special.bos} $A", pair=f"{special.bos} $A {special.bos} $B",
        special_tokens=[(special.bos, tok.token_to_id(special.bos))],
    )
    out = Tokenizer(tok, bos_token=special.bos, eos_token=special.eos, pad_token=special.pad,
                    chat_template=template, model_max_length=model_max_length)
    if out_dir is not None:
        out.save(out_dir)
    return out
