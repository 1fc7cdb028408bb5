"""Speculative decoding (docs/engine.md "Speculative decoding"): proposers (`ngram`: prompt
lookup; `draft`: a smaller model with its own KV), the acceptance rule (`accept`), and the
engine's side of it (`speculator`: proposals into a step, verification of its logits)."""
