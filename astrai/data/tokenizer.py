"""The tokenizer: HF `tokenizers` byte-level BPE plus special tokens and a chat template.

A tokenizer directory holds the files HF writes (tokenizer.json, tokenizer_config.json,
chat_template.jinja), so astrai loads any HF tokenizer directory and HF loads ours. The chat
template may sit in chat_template.jinja or in tokenizer_config.json ("chat_template").
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import tokenizers

from astrai.data.chat import render
from astrai.data.chat_ids import conversation_ids
from astrai.data.detokenize import StreamDecoder
from astrai.diskfull import writing
from astrai.errors import ConfigError, NoTemplateError
from astrai.jsonfile import read_json_object
from astrai.model.tokenizer_files import END_OF_TURN
from astrai.tempdir import sibling_tempdir


def _token_str(value: Any) -> str | None:
    """tokenizer_config.json stores a special token as a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _template_from_config(value: Any) -> str | None:
    # HF allows a list of named templates; "default" is the one apply_chat_template uses.
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default") or next(iter(named.values()), None)
    return value if isinstance(value, str) else None


class Tokenizer:
    """Byte-level BPE tokenizer with special-token ids and a chat template."""

    def __init__(self, tok: tokenizers.Tokenizer, *, bos_token: str | None = None,
                 eos_token: str | None = None, pad_token: str | None = None,
                 chat_template: str | None = None, extra_stop_ids: Sequence[int] = (),
                 model_max_length: int | None = None) -> None:
        self._tok = tok
        self.bos_token, self.eos_token, self.pad_token = bos_token, eos_token, pad_token
        self.chat_template: str | None = chat_template or None
        """The Jinja chat template; None when the tokenizer ships none (a base model)."""
        self.model_max_length = model_max_length
        self._extra_stop_ids = tuple(int(i) for i in extra_stop_ids)
        self.path: Path | None = None
        """The directory this tokenizer was loaded from or last saved to."""
        for name in ("bos_token", "eos_token", "pad_token"):
            t = getattr(self, name)
            if t is not None and tok.token_to_id(t) is None:
                raise ConfigError(f"tokenizer: {name} '{t}' is not in the vocabulary")

    # ---- files -------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Load an astrai or HF tokenizer directory (or a bare tokenizer.json file)."""
        path = Path(path)
        if path.is_file() and path.name.endswith(".json"):
            path = path.parent
        file = path / "tokenizer.json"
        if not path.exists():
            raise ConfigError(f"tokenizer: {path} does not exist; train one with "
                              "`astrai tokenizer train` or point to an HF tokenizer directory")
        if not file.is_file():
            raise ConfigError(f"tokenizer: {path} has no tokenizer.json (only fast, "
                              "tokenizer.json-based tokenizers are supported)")
        try:
            tok = tokenizers.Tokenizer.from_file(str(file))
        except Exception as e:  # the Rust side raises a plain Exception on bad files
            raise ConfigError(f"tokenizer: {file} could not be read ({e})") from e
        cfg = read_json_object(path / "tokenizer_config.json") if (
            path / "tokenizer_config.json").is_file() else {}
        smap = read_json_object(path / "special_tokens_map.json") if (
            path / "special_tokens_map.json").is_file() else {}
        special = {k: _token_str(cfg.get(k)) or _token_str(smap.get(k))
                   for k in ("bos_token", "eos_token", "pad_token")}
        tmpl_file = path / "chat_template.jinja"
        template = (tmpl_file.read_text(encoding="utf-8") if tmpl_file.is_file()
                    else _template_from_config(cfg.get("chat_template")))
        stop: list[int] = []
        gen = path / "generation_config.json"
        if gen.is_file():
            eos = read_json_object(gen).get("eos_token_id")
            stop = [eos] if isinstance(eos, int) else [i for i in (eos or []) if isinstance(i, int)]
        mml = cfg.get("model_max_length")
        out = cls(tok, **special, chat_template=template, extra_stop_ids=stop,
                  model_max_length=mml if isinstance(mml, int) and mml < 10**9 else None)
        out.path = path
        return out

    @classmethod
    def from_gguf(cls, path: str | Path) -> Tokenizer:
        """The tokenizer a GGUF file's metadata describes (astrai.model.gguf_tokenizer):
        its vocabulary and merges, special tokens and chat template."""
        from astrai.model.gguf_tokenizer import read_gguf_tokenizer

        spec = read_gguf_tokenizer(path)
        try:
            tok = tokenizers.Tokenizer.from_str(json.dumps(spec.document))
        except Exception as e:  # noqa: BLE001 (the Rust side raises a plain Exception)
            raise ConfigError(f"tokenizer: {path}: its GGUF tokenizer metadata does not make "
                              f"a tokenizer ({e}); re-convert the file") from None
        out = cls(tok, bos_token=spec.bos_token, eos_token=spec.eos_token,
                  pad_token=spec.pad_token, chat_template=spec.chat_template,
                  extra_stop_ids=spec.stop_ids)
        out.path = Path(path)
        return out

    def save(self, path: str | Path) -> None:
        """Write tokenizer.json, tokenizer_config.json and chat_template.jinja into `path`:
        all of them into a directory beside it first, then moved in, so a write that fails
        (a full disk) leaves neither a partial file nor a new directory behind; other files
        in `path` are left alone."""
        path = Path(path)
        with writing(path), sibling_tempdir(path) as tmp:
            self._write(tmp)
            path.mkdir(parents=True, exist_ok=True)
            for f in sorted(tmp.iterdir()):
                os.replace(f, path / f.name)
            tmp.rmdir()
        self.path = path

    def _write(self, path: Path) -> None:
        self._tok.save(str(path / "tokenizer.json"))
        added = {
            str(i): {"content": t.content, "special": t.special, "lstrip": t.lstrip,
                     "rstrip": t.rstrip, "normalized": t.normalized, "single_word": t.single_word}
            for i, t in sorted(self._tok.get_added_tokens_decoder().items())
        }
        cfg = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": self.bos_token, "eos_token": self.eos_token,
            "pad_token": self.pad_token, "unk_token": None,
            "added_tokens_decoder": added,
            "clean_up_tokenization_spaces": False,
            "model_max_length": self.model_max_length or 1_000_000_000,
        }
        (path / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n",
                                                    encoding="utf-8")
        if self.chat_template is not None:
            (path / "chat_template.jinja").write_text(self.chat_template, encoding="utf-8")

    # ---- ids ---------------------------------------------------------------------------
    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The underlying HF `tokenizers.Tokenizer`."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (a model needs at least this many rows)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(i)

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    @property
    def bos_id(self) -> int | None:
        return self._id(self.bos_token)

    @property
    def eos_id(self) -> int | None:
        return self._id(self.eos_token)

    @property
    def pad_id(self) -> int:
        """The pad id; falls back to eos (then 0) when the tokenizer has no pad token."""
        for t in (self.pad_token, self.eos_token):
            if self._id(t) is not None:
                return self._id(t)  # type: ignore[return-value]
        return 0

    @property
    def stop_ids(self) -> list[int]:
        """Ids that end generation: eos, end-of-turn markers, generation_config eos ids."""
        ids = [self.eos_id] + [self._id(t) for t in END_OF_TURN] + list(self._extra_stop_ids)
        out: list[int] = []
        for i in ids:
            if i is not None and i not in out:
                out.append(i)
        return out

    @property
    def special_ids(self) -> set[int]:
        return {i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}

    # ---- text <-> ids ------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; add_special_tokens applies the post-processor (e.g. BOS)."""
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_encodings(self, texts: Sequence[str]) -> list[tokenizers.Encoding]:
        """The `tokenizers.Encoding` of each text (ids, character offsets), no special tokens
        added; parallel in the Rust library."""
        return self._tok.encode_batch(list(texts), add_special_tokens=False)

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False
                     ) -> list[list[int]]:
        """Token ids of each text (parallel in the Rust library)."""
        fast = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
        return [e.ids for e in fast(list(texts), add_special_tokens=add_special_tokens)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def stream_decoder(self, skip_special_tokens: bool = True) -> StreamDecoder:
        """An incremental decoder: `push(id) -> str` never splits a multi-byte character."""
        return StreamDecoder(self.decode, skip_special_tokens=skip_special_tokens)

    # ---- chat --------------------------------------------------------------------------
    @property
    def template_vars(self) -> dict[str, Any]:
        return {"bos_token": self.bos_token or "", "eos_token": self.eos_token or "",
                "pad_token": self.pad_token or ""}

    def require_template(self, fix: str | None = None) -> str:
        """The chat template; NoTemplateError naming the file and `fix` when none."""
        if self.chat_template is None:
            where = self.path or "the tokenizer"
            raise NoTemplateError(
                f"{where} has no chat template (no chat_template.jinja, no chat_template in "
                "tokenizer_config.json): " + (fix or (
                    "pass --chat-template NAME|FILE (chatml, llama3, qwen2.5, mistral, "
                    "llama2) or --no-template to treat it as a base model")))
        return self.chat_template

    def render_chat(self, messages: Sequence[dict], add_generation_prompt: bool = False) -> str:
        """The chat template's rendering of `messages` (no BOS added beyond the template's)."""
        return render(self.require_template(), messages,
                      add_generation_prompt=add_generation_prompt, special=self.template_vars)

    def encode_chat(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                    tools: Sequence[dict] | None = None, extra: dict | None = None
                    ) -> list[int]:
        """The ids of `messages` (and `tools`, OpenAI's function list; `extra`, further
        template variables such as enable_thinking):
        `astrai.data.chat_ids.conversation_ids(...).ids`."""
        return conversation_ids(self, messages, add_generation_prompt=add_generation_prompt,
                                tools=tools, extra=extra).ids

    # ---- identity ----------------------------------------------------------------------
    def fingerprint(self) -> str:
        """A stable hash of the vocabulary, merges, added tokens and text processing.

        The chat template is not part of it: two tokenizers with the same fingerprint map
        text to the same ids, which is what a model and a dataset must agree on.
        """
        data = json.loads(self._tok.to_str())
        keep = {k: data.get(k) for k in ("model", "added_tokens", "normalizer",
                                         "pre_tokenizer", "decoder")}
        blob = json.dumps(keep, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self.vocab_size}, bos={self.bos_token!r}, "
                f"eos={self.eos_token!r}, pad={self.pad_token!r})")
