"""Records -> token arrays and loss masks, per kind (runs in the tokenization workers).

Masking (docs/spec-reference.md):
* template mode: BOS prepended (masked) unless the template writes it; the conversation is
  cut into per-message segments (`astrai.data.chat`) and each is masked by its role's rule.
  An assistant turn's generation prompt is masked; its body is trained up to and including
  the first stop token (what the model generates); anything after it is masked.
* non-template mode: the field's text, mask 1 (train) or 0 (mask) per the section's action.

A chunk of records is encoded with one `encode_batch` call (the Rust library runs it in
parallel). Each record yields ("ok", where, payload, chars) or ("error", where, message);
pretrain records outside the character filters yield ("filtered", where, reason, chars).
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from astrai.config.preprocess import PreprocessSpec
from astrai.data.chat import check_messages
from astrai.data.records import decode_line, load_json
from astrai.data.tokenizer import Tokenizer
from astrai.errors import AstraiError, DataError

# A piece of a slot: (text or None, ids or None, mask, is_assistant_body)
Piece = tuple[str | None, list[int] | None, int, bool]


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
        self.sections = spec.resolved_sections
        self.has_mask = spec.has_loss_mask
        self.stop = set(tokenizer.stop_ids)
        # compact arrays while records wait in the packing buffer
        self.dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32

    # ---- planning: record -> slots of pieces ----------------------------------------
    def _chat_pieces(self, msgs: list[dict], where: str, action: str, n_prompt: int = 0,
                     first: bool = True) -> list[Piece]:
        """Pieces of a conversation; messages before `n_prompt` are masked (dpo/grpo)."""
        pieces: list[Piece] = []
        segs = self.tok.chat_segments(msgs)
        if first and segs and self.tok.needs_bos(segs[0].text):
            pieces.append((None, [self.tok.bos_id], 0, False))  # type: ignore[list-item]
        for s in segs:
            if s.kind == "preamble" or s.index < n_prompt:
                mask = 0
            elif s.kind == "gen_prompt" and (action == "$role" or n_prompt):
                mask = 0  # the generation prompt is input, not something the model writes
            elif action == "$role":
                if s.role not in self.spec.roles:
                    raise DataError(f"{where}: role '{s.role}' has no mask rule; add "
                                    f"roles.{s.role} = train|mask to the spec")
                mask = 1 if self.spec.roles[s.role] == "train" else 0
            else:
                mask = 1 if action == "train" else 0
            pieces.append((s.text, None, mask, s.kind == "body"))
        return pieces

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
                pieces += self._chat_pieces(msgs, where, sec.action, first=j == 0)
                chars += sum(len(m["content"]) for m in msgs)
                continue
            if not isinstance(value, str):
                raise DataError(f"{where}: field '{sec.field}' must be a string, got "
                                f"{type(value).__name__}")
            if j == 0 and self.spec.add_bos and self.tok.bos_id is not None:
                pieces.append((None, [self.tok.bos_id], 0, False))
            last_mask = 1 if sec.action == "train" else 0
            pieces.append((value, None, last_mask, False))
            chars += len(value)
        if not self.sections[-1].template and self.spec.add_eos and self.tok.eos_id is not None:
            pieces.append((None, [self.tok.eos_id], last_mask, False))
        return {"input_ids": pieces}, chars

    def _plan_dpo(self, rec: dict, where: str) -> dict[str, list[Piece]]:
        prompt = _messages(self._field(rec, "prompt", where), f"{where}: field 'prompt'", "user")
        out = {}
        for key in ("chosen", "rejected"):
            resp = _messages(self._field(rec, key, where), f"{where}: field '{key}'",
                             "assistant")
            out[key] = self._chat_pieces(prompt + resp, where, "$role", n_prompt=len(prompt))
        return out

    def _plan_grpo(self, rec: dict, where: str) -> tuple[dict[str, list[Piece]], dict]:
        prompt = _messages(self._field(rec, "prompt", where), f"{where}: field 'prompt'", "user")
        segs = self.tok.chat_segments(prompt, add_generation_prompt=True)
        pieces: list[Piece] = []
        if segs and self.tok.needs_bos(segs[0].text):
            pieces.append((None, [self.tok.bos_id], 0, False))  # type: ignore[list-item]
        pieces += [(s.text, None, 0, False) for s in segs]
        slots: dict[str, list[Piece]] = {"prompts": pieces}
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
            body = [s for s in self.tok.chat_segments(prompt + msgs)
                    if s.index >= len(prompt) and s.kind == "body"]
            slots[f"responses.{g}"] = [(s.text, None, 1, True) for s in body]
        extra["rewards"] = [float(x) for x in rewards]
        return slots, extra

    # ---- assembly ------------------------------------------------------------------
    def _assemble(self, pieces: list[Piece], ids_iter) -> tuple[list[int], list[int]]:
        toks: list[int] = []
        mask: list[int] = []
        for text, ids, m, body in pieces:
            part = next(ids_iter) if text is not None else ids
            if body and m:
                # trained up to and including the first stop token; the rest is template
                cut = next((k + 1 for k, t in enumerate(part) if t in self.stop), len(part))
                mask += [1] * cut + [0] * (len(part) - cut)
            else:
                mask += [m] * len(part)
            toks += part
        return toks, mask

    def encode_lines(self, lines: list[tuple[str, int, str | bytes]]) -> list[tuple]:
        """Encode (file, line number, line text or its raw UTF-8 bytes) items; one result
        per item, in order. A line that is not UTF-8 or not JSON is one bad record."""
        plans: list[Any] = []
        texts: list[str] = []
        kind = self.spec.kind
        for file, n, line in lines:
            where = f"{file}:{n}"
            try:
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
                mine = [p[0] for pieces in slots.values() for p in pieces if p[0] is not None]
            except AstraiError as e:
                plans.append(("error", where, str(e)))
                continue
            texts += mine
            plans.append(("ok", where, slots, extra, chars))
        encoded = iter(self.tok.encode_batch(texts) if texts else [])
        return [self._finish(p, encoded) if p[0] == "ok" else p for p in plans]

    def _finish(self, plan: tuple, encoded) -> tuple:
        _, where, slots, extra, chars = plan
        arrays: dict[str, tuple[list[int], list[int]]] = {
            name: self._assemble(pieces, encoded) for name, pieces in slots.items()}
        try:
            payload = self._payload(arrays, extra, where)
        except DataError as e:
            return ("error", where, str(e))
        return ("ok", where, payload, chars)

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
        # a response is what the model generates: up to and including the first stop token
        resp = [toks[:next((k + 1 for k, t in enumerate(toks) if t in self.stop), len(toks))]
                for toks, _ in (arrays[k] for k in arrays if k.startswith("responses."))]
        if any(not r for r in resp):
            raise DataError(f"{where}: a response tokenizes to nothing")
        out["responses"] = np.asarray([t for r in resp for t in r], u32)
        out["response_lens"] = np.asarray([len(r) for r in resp], np.int32)
        out["masks"] = np.ones(len(out["responses"]), np.uint8)
        out["rewards"] = np.asarray(extra["rewards"], np.float32)
        return out
