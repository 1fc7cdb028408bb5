"""Records -> token arrays and loss masks, per kind (runs in the tokenization workers).

* template sections: the conversation is rendered once by the chat template and encoded
  once (`astrai.data.chat_ids`: the ids equal transformers' `apply_chat_template`); with the
  `$role` action the messages whose role rule is `train` are trained: their content's tokens
  (located by character offsets) and the end-of-turn tokens right after it.
* non-template sections: the field's text, mask 1 (train) or 0 (mask) per the section's action.

A chunk of records is encoded with two `encode_batch` calls (the Rust library runs them in
parallel): renders with character offsets, plain text without. Each record yields
("ok", where, payload, chars) or ("error", where, message); pretrain records outside the
character filters yield ("filtered", where, reason, chars).
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from astrai.config.preprocess import PreprocessSpec
from astrai.data.chat import check_messages
from astrai.data.chat_ids import mask_from_encoding, render_conversation
from astrai.data.records import decode_line, load_json
from astrai.data.tokenizer import Tokenizer
from astrai.errors import AstraiError, DataError

PREPROCESS_FIX = ("set chat_template in the spec (a name: chatml, llama3, qwen2.5, mistral, "
                  "llama2, or a .jinja file; --chat-template NAME|FILE on the command line), "
                  "or use sections without template: true")

# A piece of a slot: (text or None, ids or None, mask). The mask is 0/1 for every token, or
# the character spans to train when the text is a rendered conversation.
Spans = tuple[tuple[int, int], ...]
Piece = tuple[str | None, list[int] | None, int | Spans]


def _messages(value: Any, where: str, role: str) -> list[dict]:
    """A prompt or response given as a string or a message list -> a message list."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    return check_messages(value, where)


# \uD800-\uDFFF: half of a surrogate pair (an emoji written with ensure_ascii) or, alone,
# a lone surrogate; lines without one (nearly all) skip the check
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _check_encodable(rec: dict, where: str) -> None:
    """A DataError when the record holds a lone surrogate (JSON's "\\ud800" decodes to
    one): it is not a character, UTF-8 cannot encode it, and the tokenizer would refuse the
    whole batch."""
    try:
        json.dumps(rec, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise DataError(f"{where}: holds a lone surrogate (\\u{ord(e.object[e.start]):04x}), "
                        "which is not a character; fix the record or pass --on-error skip"
                        ) from None


class RecordEncoder:
    """Turns raw JSONL lines into token payloads for one spec and tokenizer."""

    def __init__(self, spec: PreprocessSpec, tokenizer: Tokenizer) -> None:
        self.spec, self.tok = spec, tokenizer
        if spec.chat_template is not None:
            from astrai.data.chat_templates import resolve_template

            tokenizer.chat_template = resolve_template(spec.chat_template)
        if spec.kind in ("dpo", "grpo") or any(s.template for s in self.spec.resolved_sections):
            tokenizer.require_template(PREPROCESS_FIX)
        self.sections = spec.resolved_sections
        self.has_mask = spec.has_loss_mask
        self.stop = set(tokenizer.stop_ids)
        self.train_roles = frozenset(r for r, rule in spec.roles.items() if rule == "train")
        # compact arrays while records wait in the packing buffer
        self.dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32

    # ---- planning: record -> slots of pieces ----------------------------------------
    def _chat_piece(self, msgs: list[dict], where: str, action: str, *,
                    n_prompt: int = 0, add_generation_prompt: bool = False) -> Piece:
        """A conversation rendered once; messages before `n_prompt` are never trained."""
        if action == "$role":
            for m in msgs:
                if m["role"] not in self.spec.roles:
                    raise DataError(f"{where}: role '{m['role']}' has no mask rule; add "
                                    f"roles.{m['role']} = train|mask to the spec")
            train = self.train_roles
        else:
            train = ()
        rc = render_conversation(self.tok, msgs, add_generation_prompt=add_generation_prompt,
                                 train_roles=train, first_trained=n_prompt, where=where)
        if action != "$role":
            return (rc.text, None, 1 if action == "train" else 0)
        return (rc.text, None, rc.spans)

    def _field(self, rec: dict, field: str, where: str) -> Any:
        if field not in rec:
            raise DataError(f"{where}: missing field '{field}' (keys: {', '.join(sorted(rec))})")
        return rec[field]

    def _plan_text(self, rec: dict, where: str) -> tuple[dict[str, list[Piece]], int]:
        pieces: list[Piece] = []
        chars = 0
        last_mask = 1
        for j, sec in enumerate(self.sections):
            value = self._field(rec, sec.field, where)
            if sec.template:
                msgs = check_messages(value, f"{where}: field '{sec.field}'")
                pieces.append(self._chat_piece(msgs, where, sec.action))
                chars += sum(len(m["content"]) for m in msgs)
                continue
            if not isinstance(value, str):
                raise DataError(f"{where}: field '{sec.field}' must be a string, got "
                                f"{type(value).__name__}")
            if j == 0 and self.spec.add_bos and self.tok.bos_id is not None:
                pieces.append((None, [self.tok.bos_id], 0))
            last_mask = 1 if sec.action == "train" else 0
            pieces.append((value, None, last_mask))
            chars += len(value)
        if not self.sections[-1].template and self.spec.add_eos and self.tok.eos_id is not None:
            pieces.append((None, [self.tok.eos_id], last_mask))
        return {"input_ids": pieces}, chars

    def _plan_dpo(self, rec: dict, where: str) -> dict[str, list[Piece]]:
        prompt = _messages(self._field(rec, "prompt", where), f"{where}: field 'prompt'", "user")
        out = {}
        for key in ("chosen", "rejected"):
            resp = _messages(self._field(rec, key, where), f"{where}: field '{key}'",
                             "assistant")
            out[key] = [self._chat_piece(prompt + resp, where, "$role", n_prompt=len(prompt))]
        return out

    def _plan_grpo(self, rec: dict, where: str) -> tuple[dict[str, list[Piece]], dict]:
        prompt = _messages(self._field(rec, "prompt", where), f"{where}: field 'prompt'", "user")
        slots: dict[str, list[Piece]] = {"prompts": [self._chat_piece(
            prompt, where, "mask", add_generation_prompt=True)]}
        extra: dict[str, Any] = {}
        if "responses" not in rec:
            ref = rec.get("reference", "")
            if ref is None or isinstance(ref, bool) or not isinstance(ref, (str, int, float)):
                raise DataError(f"{where}: field 'reference' must be a string or number")
            extra["reference"] = str(ref)
            return slots, extra
        resps, rewards = rec["responses"], self._field(rec, "rewards", where)
        if not isinstance(resps, list) or not resps:
            raise DataError(f"{where}: field 'responses' must be a non-empty list")
        if not isinstance(rewards, list) or len(rewards) != len(resps) or not all(
                isinstance(r, (int, float)) and not isinstance(r, bool) for r in rewards):
            raise DataError(f"{where}: field 'rewards' must be a list of {len(resps)} numbers "
                            "(one per response)")
        for g, r in enumerate(resps):
            msgs = _messages(r, f"{where}: field 'responses[{g}]'", "assistant")
            slots[f"responses.{g}"] = [self._chat_piece(prompt + msgs, where, "$role",
                                                        n_prompt=len(prompt))]
        extra["rewards"] = [float(x) for x in rewards]
        return slots, extra

    # ---- assembly ------------------------------------------------------------------
    def _assemble(self, pieces: list[Piece], plain, rendered) -> tuple[list[int], list[int]]:
        toks: list[int] = []
        mask: list[int] = []
        for text, ids, m in pieces:
            if isinstance(m, tuple):
                enc = next(rendered)
                part = enc.ids
                mask += mask_from_encoding(enc, m, self.stop)
            else:
                part = next(plain) if text is not None else ids
                mask += [m] * len(part)
            toks += part
        return toks, mask

    def encode_lines(self, lines: list[tuple[str, int | str, str | bytes | dict]]
                     ) -> list[tuple]:
        """Encode (file, position, line text or its raw UTF-8 bytes, or a record already
        parsed, as Parquet rows are) items; one result per item, in order. A line that is
        not UTF-8 or not JSON is one bad record."""
        plans: list[Any] = []
        texts: list[str] = []
        renders: list[str] = []
        kind = self.spec.kind
        for file, n, line in lines:
            where = f"{file}:{n}"
            try:
                if isinstance(line, dict):
                    rec = line  # Arrow strings are valid UTF-8: no surrogate to check
                else:
                    if isinstance(line, bytes):
                        line = decode_line(line, where)
                    rec = load_json(line, where)
                    if not isinstance(rec, dict):
                        raise DataError(f"{where}: expected a JSON object, got "
                                        f"{type(rec).__name__}")
                    if SURROGATE_ESCAPE.search(line):  # only such an escape decodes to one
                        _check_encodable(rec, where)
                extra: dict = {}
                chars = 0
                if kind in ("pretrain", "sft"):
                    slots, chars = self._plan_text(rec, where)
                    f = self.spec.filters
                    if kind == "pretrain" and not f.min_chars <= chars <= f.max_chars:
                        reason = "short" if chars < f.min_chars else "long"
                        plans.append(("filtered", where, reason, chars))
                        continue
                elif kind == "dpo":
                    slots = self._plan_dpo(rec, where)
                else:
                    slots, extra = self._plan_grpo(rec, where)
            except AstraiError as e:
                plans.append(("error", where, str(e)))
                continue
            for pieces in slots.values():
                for text, _, m in pieces:
                    if text is not None:
                        (renders if isinstance(m, tuple) else texts).append(text)
            plans.append(("ok", where, slots, extra, chars))
        plain = iter(self.tok.encode_batch(texts) if texts else [])
        rendered = iter(self.tok.encode_encodings(renders) if renders else [])
        return [self._finish(p, plain, rendered) if p[0] == "ok" else p for p in plans]

    def _finish(self, plan: tuple, plain, rendered) -> tuple:
        _, where, slots, extra, chars = plan
        arrays: dict[str, tuple[list[int], list[int]]] = {
            name: self._assemble(pieces, plain, rendered) for name, pieces in slots.items()}
        try:
            payload = self._payload(arrays, extra, where)
        except DataError as e:
            return ("error", where, str(e))
        return ("ok", where, payload, chars)

    def _response(self, prompt: list[int], toks: list[int], mask: list[int]) -> list[int]:
        """What the model generates after `prompt` to give the conversation `toks`: the ids
        after the prompt when they extend it (a template's `<think>` block included), else
        the trained ids; up to and including the first stop token."""
        if toks[:len(prompt)] == prompt:
            out = toks[len(prompt):]
        else:  # a merge across the prompt's end: keep the reply's own tokens
            out = [t for t, m in zip(toks, mask, strict=True) if m]
        return out[:next((k + 1 for k, t in enumerate(out) if t in self.stop), len(out))]

    def _payload(self, arrays: dict, extra: dict, where: str) -> dict[str, np.ndarray]:
        kind = self.spec.kind
        u32 = self.dtype
        if kind in ("pretrain", "sft"):
            toks, mask = arrays["input_ids"]
            if not any(t not in (self.tok.bos_id, self.tok.eos_id) for t in toks):
                fields = ", ".join(f"'{s.field}'" for s in self.sections)
                raise DataError(f"{where}: {fields} tokenizes to nothing; remove the record "
                                "or pass --on-error skip")
            if self.has_mask and not any(mask[1:]):
                raise DataError(f"{where}: no token is trained (no message with a 'train' "
                                "rule?); check the roles / sections of the spec")
            out = {"input_ids": np.asarray(toks, u32)}
            if self.has_mask:
                out["loss_mask"] = np.asarray(mask, np.uint8)
            return out
        if kind == "dpo":
            out = {}
            for key in ("chosen", "rejected"):
                toks, mask = arrays[key]
                out[key], out[f"{key}_mask"] = np.asarray(toks, u32), np.asarray(mask, np.uint8)
            return out
        out = {"prompts": np.asarray(arrays["prompts"][0], u32)}
        if "reference" in extra:
            out["reference"] = np.frombuffer(extra["reference"].encode("utf-8"), np.uint8)
            return out
        prompt = arrays["prompts"][0]
        resp = [self._response(prompt, *arrays[k]) for k in arrays if k.startswith("responses.")]
        if any(not r for r in resp):
            raise DataError(f"{where}: a response tokenizes to nothing")
        out["responses"] = np.asarray([t for r in resp for t in r], u32)
        out["response_lens"] = np.asarray([len(r) for r in resp], np.int32)
        out["masks"] = np.ones(len(out["responses"]), np.uint8)
        out["rewards"] = np.asarray(extra["rewards"], np.float32)
        return out
