"""Export an astrai checkpoint as one GGUF file for llama.cpp (and ollama, LM Studio).

Written with the `gguf` package (llama.cpp's own gguf-py): the architecture and
hyperparameters (`{arch}.context_length`, ...), the tokenizer (astrai.model.gguf_vocab),
the tensors under llama.cpp's names (astrai.model.gguf_names) in f32 / f16 / bf16 or Q8_0.
Which tensors keep f32 follows llama.cpp's converter: 1-D tensors (norm gains, biases,
RoPE frequency factors) always; with Q8_0, 2-D tensors whose rows are not a multiple of
32 values (a Q8_0 block) keep the float dtype. The file is written beside OUT and renamed
into place; it carries `astrai.export` in its metadata, the marker that lets `--overwrite`
replace an earlier export and nothing else (docs/export.md).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch

from astrai import __version__
from astrai.diskfull import writing
from astrai.errors import CheckpointError, MissingExtraError, UnsupportedModelError
from astrai.model.config import ModelConfig
from astrai.model.gguf_names import gguf_arch, gguf_tensors
from astrai.model.gguf_vocab import GGUFVocab, read_vocab
from astrai.model.hf import read_config

MARKER_KEY = "astrai.export"
"""GGUF metadata key marking a file as an astrai export (JSON: producer, source)."""
QUANTIZE = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")
"""The block types (32 values each) gguf-py quantizes; its K-quants (q4_k ...) raise
NotImplementedError there, so they are not offered."""
GGUF_INSTALL = "pip install 'astrai[gguf]'"


def require_gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise MissingExtraError(f"--format gguf needs the gguf package, which is not "
                                f"installed: {GGUF_INSTALL}") from None
    return gguf


def export_gguf(checkpoint: str | Path, out: str | Path, *, dtype: torch.dtype | None = None,
                quantize: str | None = None, overwrite: bool = False, merge_lora: bool = False,
                adapter: str | Path | None = None) -> Path:
    """Write `out`, a GGUF file llama.cpp runs: weights in `dtype` (None keeps the
    checkpoint's; 1-D tensors stay f32) or `quantize`d (QUANTIZE: "q8_0", "q4_0", ...). An existing `out` is
    replaced only with `overwrite`, and only when it is an earlier export. A LoRA adapter
    (`adapter`, or the checkpoint's `adapter/`) must be merged (`merge_lora`)."""
    from astrai.model.adapter import find_adapter, merge_adapter
    from astrai.model.hf import load_pretrained

    gguf = require_gguf()
    checkpoint, out = Path(checkpoint), Path(out)
    if quantize is not None and quantize not in QUANTIZE:
        raise UnsupportedModelError(f"--quantize {quantize}: not supported; GGUF export "
                                    f"quantizes to {', '.join(QUANTIZE)}")
    config, _ = read_config(checkpoint)
    arch = gguf_arch(config)  # refuse MoE before reading any weights
    check_gguf_output(out, overwrite)
    lora = find_adapter(checkpoint, adapter)
    if lora is not None and not merge_lora:
        raise UnsupportedModelError(f"{lora}: a LoRA adapter; GGUF export writes full weights, "
                                    "so pass --merge-lora to fold it in")
    if merge_lora and lora is None:
        raise CheckpointError(f"{checkpoint}: no LoRA adapter to merge (no adapter/ inside); "
                              "pass --adapter DIR or drop --merge-lora")
    vocab = read_vocab(checkpoint, config.vocab_size)
    rope_freqs = _rope_params(config, arch)[1]
    model, config, _ = load_pretrained(checkpoint, dtype=dtype)
    if merge_lora:
        merge_adapter(model, lora)
    state = gguf_tensors(model.state_dict(), config, arch)
    if rope_freqs is not None:
        state["rope_freqs.weight"] = rope_freqs
    # with q8_0, rows that do not split into blocks keep --dtype, f16 for auto (llama.cpp's)
    fallback = torch.float16 if quantize else next(iter(state.values())).dtype
    float_type = _float_type(gguf, dtype or fallback)
    writer_args = (checkpoint, config, arch, vocab, state, float_type, quantize)
    _write_atomic(out, lambda path: _write(gguf, path, *writer_args))
    return out


def check_gguf_output(out: Path, overwrite: bool) -> None:
    """Refuse an existing `out` unless `overwrite` and it is a GGUF file holding MARKER_KEY."""
    if not out.exists() and not out.is_symlink():
        return
    if not overwrite:
        raise CheckpointError(f"{out}: already exists; choose another path or pass --overwrite "
                              "(it replaces only an earlier astrai export)")
    if out.is_symlink() or not out.is_file() or not is_gguf_export(out):
        what = ("a symlink" if out.is_symlink() else "a directory" if out.is_dir() else
                f"a file without the {MARKER_KEY} GGUF key")
        raise CheckpointError(f"{out}: {what}, not an earlier astrai GGUF export; --overwrite "
                              "replaces only those, so remove it yourself or choose another path")


def is_gguf_export(path: Path) -> bool:
    """Whether `path` is a readable GGUF file carrying astrai's export marker."""
    gguf = require_gguf()
    try:
        field = gguf.GGUFReader(path).get_field(MARKER_KEY)
        return field is not None and isinstance(json.loads(field.contents()), dict)
    except (OSError, ValueError, LookupError, TypeError, UnicodeDecodeError):
        return False  # unreadable or truncated (the reader's ValueError / IndexError): not ours


def _write_atomic(out: Path, write) -> None:
    """`write(path)` into a locked temporary directory beside `out` (after removing those
    of killed exports), then rename the file to `out`; nothing is left when it raises."""
    from astrai.model.export_output import export_tempdir
    from astrai.tempdir import follow_umask

    with writing(out), export_tempdir(out, "path") as tmp:
        write(tmp / out.name)
        follow_umask(tmp / out.name)
        os.replace(tmp / out.name, out)
    tmp.rmdir()


def _float_type(gguf: Any, dtype: torch.dtype) -> Any:
    types = {torch.float32: gguf.GGMLQuantizationType.F32,
             torch.float16: gguf.GGMLQuantizationType.F16,
             torch.bfloat16: gguf.GGMLQuantizationType.BF16}
    if dtype not in types:
        raise UnsupportedModelError(f"dtype {dtype} cannot be exported to GGUF; use float32, "
                                    "float16 or bfloat16")
    return types[dtype]


def _write(gguf: Any, path: Path, checkpoint: Path, c: ModelConfig, arch: str,
           vocab: GGUFVocab, state: dict[str, torch.Tensor], float_type: Any,
           quantize: str | None) -> None:
    w = gguf.GGUFWriter(path, arch)
    w.add_name(checkpoint.resolve().name)
    w.add_string(MARKER_KEY, json.dumps({"producer": f"astrai {__version__}",
                                         "source": str(checkpoint.resolve())}))
    _hparams(gguf, w, c, arch)
    _tokenizer(w, vocab)
    qtypes = set()
    for name, t in state.items():
        data, qtype = _encode(gguf, t, float_type, quantize)
        qtypes.add(qtype)
        w.add_tensor(name, data, raw_dtype=qtype)
    w.add_file_type(_file_type(gguf, qtypes))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _encode(gguf: Any, t: torch.Tensor, float_type: Any, quantize: str | None
            ) -> tuple[Any, Any]:
    """(numpy data, GGML type) of one tensor: 1-D in f32; 2-D in the `quantize` block type
    when asked and the rows split into 32-value blocks, otherwise in `float_type`."""
    Q = gguf.GGMLQuantizationType
    x = t.detach().to(torch.float32).contiguous().numpy()
    qtype = Q.F32 if t.dim() <= 1 else float_type
    if t.dim() > 1 and quantize is not None and t.shape[-1] % 32 == 0:
        qtype = Q[quantize.upper()]
    return gguf.quants.quantize(x, qtype), qtype


def _file_type(gguf: Any, qtypes: set) -> int:
    """`general.file_type`: the type of the 2-D weights (llama.cpp's "mostly ..." types)."""
    Q, F = gguf.GGMLQuantizationType, gguf.LlamaFileType
    for q, f in ((Q.Q8_0, F.MOSTLY_Q8_0), (Q.Q4_0, F.MOSTLY_Q4_0), (Q.Q4_1, F.MOSTLY_Q4_1),
                 (Q.Q5_0, F.MOSTLY_Q5_0), (Q.Q5_1, F.MOSTLY_Q5_1), (Q.BF16, F.MOSTLY_BF16),
                 (Q.F16, F.MOSTLY_F16)):
        if q in qtypes:
            return f
    return F.ALL_F32


def _rope_params(c: ModelConfig, arch: str) -> tuple[dict[str, Any], torch.Tensor | None]:
    """({"base": rope_freq_base, rope.scaling.* values}, rope_freqs.weight or None): what
    gives llama.cpp astrai's RoPE table (astrai.model.rope). Static NTK is a base change; llama3's banded
    scaling is llama.cpp's per-pair frequency divisors (written for its llama arch only);
    YaRN's cos/sin factor is llama.cpp's attn_factor times its own 1 + 0.1·ln(factor)."""
    from astrai.model.rope import rope_inv_freq

    s, theta, d = c.rope_scaling, float(c.rope_theta), c.hdim
    if s.type == "none" or (s.type != "yarn" and s.factor == 1.0):
        return {"base": theta}, None
    if s.type == "linear":
        return {"base": theta, "type": "linear", "factor": s.factor}, None
    if s.type == "ntk":
        return {"base": theta * s.factor ** (d / (d - 2))}, None
    if s.type == "llama3":
        if arch != "llama":
            raise UnsupportedModelError(
                f"llama3 RoPE scaling with a {arch} model cannot be exported to GGUF: "
                "astrai writes its frequency factors (rope_freqs) only for the llama "
                "architecture, whose llama.cpp loader is known to read them")
        plain, _ = rope_inv_freq(d, theta)
        scaled, _ = rope_inv_freq(d, theta, s)
        return {"base": theta}, (plain.double() / scaled.double()).float()
    # astrai (HF) scales cos/sin by attention_factor, default 0.1·ln(f) + 1 (1 when f <= 1);
    # ggml's rope_yarn by attn_factor · (1 + 0.1·ln f), so attn_factor is their ratio.
    ours = s.attention_factor
    if ours is None:
        ours = 0.1 * math.log(s.factor) + 1.0 if s.factor > 1 else 1.0
    ratio = ours / (0.1 * math.log(s.factor) + 1.0)
    yarn = {"base": theta, "type": "yarn", "factor": s.factor, "beta_fast": s.beta_fast,
            "beta_slow": s.beta_slow,
            "orig_ctx": s.original_max_position_embeddings or 4096}
    if not math.isclose(ratio, 1.0):
        yarn["attn_factor"] = ratio
    return yarn, None


def _hparams(gguf: Any, w: Any, c: ModelConfig, arch: str) -> None:
    """The `{arch}.*` hyperparameters. A sliding window caps the context length: within
    the window, sliding-window attention is full causal attention, which llama.cpp's llama,
    qwen2 and qwen3 run."""
    ctx = min(c.max_seq_len, c.sliding_window or c.max_seq_len)
    w.add_context_length(ctx)
    w.add_embedding_length(c.dim)
    w.add_block_count(c.n_layers)
    w.add_feed_forward_length(c.ffn_dim)
    w.add_head_count(c.n_heads)
    w.add_head_count_kv(c.kv_heads)
    w.add_key_length(c.hdim)
    w.add_value_length(c.hdim)
    w.add_rope_dimension_count(c.hdim)
    w.add_layer_norm_rms_eps(c.norm_eps)
    w.add_vocab_size(c.vocab_size)
    rope, _ = _rope_params(c, arch)
    w.add_rope_freq_base(rope["base"])
    if "type" in rope:
        w.add_rope_scaling_type(gguf.RopeScalingType(rope["type"]))
        w.add_rope_scaling_factor(rope["factor"])
    if rope.get("type") == "yarn":
        w.add_rope_scaling_orig_ctx_len(rope["orig_ctx"])
        w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
        if "attn_factor" in rope:
            w.add_rope_scaling_yarn_attn_factor(rope["attn_factor"])


def _tokenizer(w: Any, v: GGUFVocab) -> None:
    """The `tokenizer.ggml.*` keys and the chat template."""
    w.add_tokenizer_model(v.model)
    if v.pre is not None:
        w.add_tokenizer_pre(v.pre)
    w.add_token_list(v.tokens)
    w.add_token_types(v.types)
    if v.scores is not None:
        w.add_token_scores(v.scores)
    if v.merges:
        w.add_token_merges(v.merges)
    adders = {"bos": w.add_bos_token_id, "eos": w.add_eos_token_id, "pad": w.add_pad_token_id,
              "unk": w.add_unk_token_id, "eot": w.add_eot_token_id}
    for key, add in adders.items():
        if key in v.special:
            add(v.special[key])
    w.add_add_bos_token(v.add_bos)
    w.add_add_eos_token(v.add_eos)
    if v.add_space_prefix is not None:
        w.add_add_space_prefix(v.add_space_prefix)
    if v.chat_template is not None:
        w.add_chat_template(v.chat_template)
