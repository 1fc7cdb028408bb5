"""A GGUF file (llama.cpp's format) opened for reading, and its ModelConfig.

Read with the `gguf` package (llama.cpp's own gguf-py, `gguf.GGUFReader`), which parses the
header, the metadata and the tensor table and maps the tensor data without reading it. The
`{arch}.*` hyperparameters (the GGUF spec, "LLM" keys) become a ModelConfig for the dense
`llama` (Mistral included: llama.cpp's converter writes it as llama), `qwen2` and `qwen3`
architectures; any other architecture, or a key astrai cannot honour (partial RoPE, value
heads of another width, an unknown RoPE scaling), is refused in one line before a weight is
read. The tensor shapes are checked against the config as a safetensors header is
(checkpoint.check_config_shapes), so a hostile file cannot make astrai build 10^6 blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from astrai.errors import CheckpointError, UnsupportedModelError
from astrai.model.checkpoint import check_config_shapes
from astrai.model.config import ModelConfig, RopeScaling
from astrai.model.gguf_names import astrai_name
from astrai.model.gguf_weights import tensor_values
from astrai.model.rope import rope_inv_freq

ARCHS = ("llama", "qwen2", "qwen3")
"""The llama.cpp architectures astrai runs (gguf_names writes the same three)."""
SUFFIX = ".gguf"
GGUF_INSTALL = "pip install 'astrai[gguf]'"
LLAMA3_ORIG_CTX = tuple(1 << k for k in range(4, 21))
"""Pre-training lengths tried when recognising Llama 3 RoPE scaling in `rope_freqs`."""


def is_gguf(path: str | Path) -> bool:
    """Whether `path` names a GGUF file (by its `.gguf` suffix, as llama.cpp's tools do)."""
    return Path(path).suffix.lower() == SUFFIX and not Path(path).is_dir()


def require_gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise UnsupportedModelError(f"reading a .gguf file needs the gguf package, which is "
                                    f"not installed: {GGUF_INSTALL}") from None
    return gguf


@dataclass
class GGUFFile:
    """One parsed GGUF file: its path, the gguf reader, and llama.cpp's architecture."""

    path: Path
    reader: Any
    arch: str

    def value(self, key: str, default: Any = None) -> Any:
        """The metadata value under `key` (`{arch}` filled in), or `default`."""
        field = self.reader.get_field(key.format(arch=self.arch))
        if field is None:
            return default
        try:
            return field.contents()
        except (ValueError, IndexError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{self.path}: metadata {field.name} is unreadable ({e}); "
                                  "re-download or re-convert the file") from None

    def number(self, key: str, default: Any = None, kind: type = int) -> Any:
        """A numeric metadata value; a string or list where a number belongs is refused."""
        v = self.value(key, default)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        if v is None or (ok and (kind is float or isinstance(v, int))):
            # a float32 value as its shortest decimal (1e-05, not 9.99999974e-06): the value
            # the writer meant, as llama.cpp's converter writes floats in 32 bits
            return v if v is None else kind(str(np.float32(v)) if kind is float else v)
        raise CheckpointError(f"{self.path}: metadata {key.format(arch=self.arch)} is {v!r}, "
                              f"not a{'n integer' if kind is int else ' number'}; the file is "
                              "corrupt or not llama.cpp's, re-convert it")

    def tensor_infos(self) -> dict[str, Any]:
        """The file's tensors by GGUF name (data mapped, not read)."""
        return {t.name: t for t in self.reader.tensors}


def open_gguf(path: str | Path) -> GGUFFile:
    """Parse `path`; a missing, truncated or malformed file, or an architecture astrai does
    not run, is one CheckpointError / UnsupportedModelError naming the file."""
    gguf = require_gguf()
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such GGUF file; pass a .gguf file or a checkpoint "
                              "directory")
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, IndexError, KeyError, OSError, OverflowError, UnicodeDecodeError,
            AssertionError) as e:
        raise CheckpointError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e}); "
                              "the file is truncated or corrupt, re-download or re-convert "
                              "it") from None
    field = reader.get_field("general.architecture")
    arch = field.contents() if field is not None else None
    if arch not in ARCHS:
        raise UnsupportedModelError(
            f"{path}: GGUF architecture {arch!r} is not one astrai runs ({', '.join(ARCHS)}; "
            "Mistral files are llama); convert a Llama, Qwen2, Qwen3 or Mistral model")
    return GGUFFile(path, reader, arch)


def gguf_config(g: GGUFFile) -> ModelConfig:
    """The ModelConfig of `g`'s `{arch}.*` hyperparameters and its tensor table."""
    from gguf import Keys

    infos = g.tensor_infos()
    embd = infos.get("token_embd.weight")
    if embd is None:
        raise CheckpointError(f"{g.path}: no token_embd.weight tensor; not a complete "
                              "llama.cpp language model, re-convert it")
    dim = _required(g, Keys.LLM.EMBEDDING_LENGTH)
    heads = _required(g, Keys.Attention.HEAD_COUNT)
    hdim = g.number(Keys.Attention.KEY_LENGTH, None) or (dim // heads if heads > 0 else 1)
    _same(g, Keys.Attention.VALUE_LENGTH, hdim, "the value heads' width differs from the keys'")
    _same(g, Keys.Rope.DIMENSION_COUNT, hdim, "RoPE rotates only part of each head")
    theta, scaling = _rope(g, hdim, infos)
    data = {
        "vocab_size": int(embd.shape[-1]) if len(embd.shape) == 2 else -1,
        "dim": dim, "n_layers": _required(g, Keys.LLM.BLOCK_COUNT), "n_heads": heads,
        "n_kv_heads": g.number(Keys.Attention.HEAD_COUNT_KV, heads), "head_dim": hdim,
        "ffn_dim": _required(g, Keys.LLM.FEED_FORWARD_LENGTH),
        "max_seq_len": _required(g, Keys.LLM.CONTEXT_LENGTH),
        "norm_eps": g.number(Keys.Attention.LAYERNORM_RMS_EPS, 1e-5, float),
        "rope_theta": theta, "rope_scaling": scaling,
        "tie_embeddings": "output.weight" not in infos,
        "qkv_bias": "blk.0.attn_q.bias" in infos,
        "qk_norm": "blk.0.attn_q_norm.weight" in infos,
    }
    config = ModelConfig.from_dict(data, source=f"{g.path} (GGUF metadata)")
    shapes = {astrai_name(n): tuple(int(d) for d in reversed(t.shape)) for n, t in infos.items()}
    check_config_shapes(config, {k: v for k, v in shapes.items() if k}, f"{g.path}")
    return config


def _required(g: GGUFFile, key: str) -> int:
    v = g.number(key)
    if v is None:
        raise CheckpointError(f"{g.path}: no {key.format(arch=g.arch)} in the metadata; the "
                              "file is incomplete, re-convert it with llama.cpp's "
                              "convert_hf_to_gguf.py")
    return v


def _same(g: GGUFFile, key: str, want: int, why: str) -> None:
    v = g.number(key)
    if v is not None and v != want:
        raise UnsupportedModelError(f"{g.path}: {key.format(arch=g.arch)} is {v} but the key "
                                    f"heads are {want} wide ({why}); astrai cannot run it")


def _rope(g: GGUFFile, hdim: int, infos: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """(rope_theta, RopeScaling fields): the inverse of gguf_export's `_rope_params`."""
    from gguf import Keys

    theta = g.number(Keys.Rope.FREQ_BASE, 10000.0, float)
    kind = g.value(Keys.Rope.SCALING_TYPE, "none")
    factor = g.number(Keys.Rope.SCALING_FACTOR, 1.0, float)
    if "rope_freqs.weight" in infos:
        if kind not in ("none", None):
            raise UnsupportedModelError(f"{g.path}: rope_freqs with RoPE scaling {kind!r}; "
                                        "astrai reads rope_freqs only as Llama 3 scaling")
        return theta, _llama3(g, hdim, theta, infos["rope_freqs.weight"])
    if kind in ("none", None) or (kind == "linear" and factor == 1.0):
        return theta, {"type": "none"}
    if kind == "linear":
        return theta, {"type": "linear", "factor": factor}
    if kind != "yarn":
        raise UnsupportedModelError(f"{g.path}: RoPE scaling {kind!r} is not one astrai runs "
                                    "(none, linear, yarn, Llama 3 rope_freqs)")
    yarn = {"type": "yarn", "factor": factor,
            "original_max_position_embeddings": g.number(Keys.Rope.SCALING_ORIG_CTX_LEN),
            "beta_fast": g.number(Keys.Rope.SCALING_YARN_BETA_FAST, 32.0, float),
            "beta_slow": g.number(Keys.Rope.SCALING_YARN_BETA_SLOW, 1.0, float)}
    attn = g.number(Keys.Rope.SCALING_YARN_ATTN_FACTOR, None, float)
    if attn is not None and factor > 0:
        # ggml's rope_yarn scales cos/sin by attn_factor · (1 + 0.1·ln f); astrai (as HF) by
        # attention_factor alone
        yarn["attention_factor"] = attn * (0.1 * math.log(factor) + 1.0)
    return theta, yarn


def _llama3(g: GGUFFile, hdim: int, theta: float, info: Any) -> dict[str, Any]:
    """Llama 3 ("llama3" in HF's rope_scaling) parameters whose frequency divisors equal the
    file's `rope_freqs` (what llama.cpp's converter writes for Llama 3.1+: the scaling's
    factor, low/high frequency factors and original length leave no other trace)."""
    if tuple(info.shape) != (hdim // 2,):
        raise CheckpointError(f"{g.path}: rope_freqs.weight has shape {list(info.shape)}, not "
                              f"[{hdim // 2}] (half the head width); re-convert the file")
    divisors = tensor_values(g, info).double()
    factor = float(divisors.max())
    plain, _ = rope_inv_freq(hdim, theta)
    for orig in LLAMA3_ORIG_CTX:
        s = {"type": "llama3", "factor": factor, "low_freq_factor": 1.0,
             "high_freq_factor": 4.0, "original_max_position_embeddings": orig}
        scaled, _ = rope_inv_freq(hdim, theta, RopeScaling(**s))
        if torch.allclose(plain.double() / scaled.double(), divisors, rtol=1e-4, atol=1e-6):
            return s
    raise UnsupportedModelError(
        f"{g.path}: rope_freqs.weight is not Llama 3 RoPE scaling astrai recognises (low/high "
        "frequency factors 1 and 4); astrai cannot reproduce its RoPE, so it refuses the file")
