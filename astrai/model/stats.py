"""Parameter counts, FLOPs per token and weight memory: pure functions of a ModelConfig.

FLOPs follow the PaLM convention (Chowdhery et al., 2022, Appendix B), the one MFU is
quoted in (also Chinchilla, Hoffmann et al., 2022, Appendix F, without its small terms):

    forward  = 2 N + 4 L H D T          training = 3 x forward = 6 N + 12 L H D T

N counts the weights that multiply every token: attention and MLP projections, the MoE
router and the top_k + shared experts a token actually visits, and the output projection
(counted even when tied: the lookup is free, the logits matmul is not). Embedding lookups,
norm gains and biases are not matmuls and are left out. The attention term counts QK^T and
AV over T context positions per token (2 FLOPs per multiply-add, 2 matmuls, H heads of
width D, L layers), without halving for the causal mask, as PaLM does. With a sliding
window the context is min(T, W). Backward is twice forward.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from astrai.model.config import ModelConfig

BYTES = {"fp32": 4, "bf16": 2}


@dataclass(frozen=True)
class ParamCounts:
    """Parameters by component; tied embeddings are counted once (under embedding)."""

    embedding: int
    """Token embedding table V x C."""
    attention: int
    """q/k/v/o projections (+ q/k/v biases), all layers."""
    mlp: int
    """Dense SwiGLU MLPs plus every MoE expert (routed and shared), all layers."""
    router: int
    """MoE router weights, all MoE layers."""
    norms: int
    """RMSNorm gains: two per layer plus the final norm (+ q/k head norms with qk_norm)."""
    lm_head: int
    """Output projection V x C; 0 when tied to the embedding."""
    active: int
    """Parameters used per token: as total, but only top_k routed experts per MoE layer."""

    @property
    def total(self) -> int:
        return self.embedding + self.attention + self.mlp + self.router + self.norms + self.lm_head

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "total": self.total}


def _swiglu(c: ModelConfig) -> int:
    return 3 * c.dim * c.ffn_dim  # gate, up: C x F; down: F x C


def _attention_weights(c: ModelConfig) -> int:
    H, K, D, C = c.n_heads, c.kv_heads, c.hdim, c.dim
    return C * H * D + 2 * C * K * D + H * D * C  # q, k + v, o


def param_counts(c: ModelConfig) -> ParamCounts:
    H, K, D, C, V, L = c.n_heads, c.kv_heads, c.hdim, c.dim, c.vocab_size, c.n_layers
    attn_bias = (H * D + 2 * K * D) if c.qkv_bias else 0
    n_moe = sum(c.is_moe_layer(i) for i in range(L))
    n_dense = L - n_moe
    mlp = n_dense * _swiglu(c) + n_moe * (c.n_experts + c.n_shared_experts) * _swiglu(c)
    active_mlp = n_dense * _swiglu(c) + n_moe * (c.moe_top_k + c.n_shared_experts) * _swiglu(c)
    router = n_moe * C * c.n_experts
    counts = {
        "embedding": V * C,
        "attention": L * (_attention_weights(c) + attn_bias),
        "mlp": mlp,
        "router": router,
        "norms": (2 * L + 1) * C + (2 * L * D if c.qk_norm else 0),
        "lm_head": 0 if c.tie_embeddings else V * C,
    }
    active = sum(counts.values()) - mlp + active_mlp
    return ParamCounts(**counts, active=active)


def matmul_params(c: ModelConfig) -> int:
    """N of the 6N rule: weights each token multiplies (see module doc)."""
    L, n_moe = c.n_layers, sum(c.is_moe_layer(i) for i in range(c.n_layers))
    per_token_mlp = (L - n_moe) * _swiglu(c) + n_moe * (
        (c.moe_top_k + c.n_shared_experts) * _swiglu(c) + c.dim * c.n_experts
    )
    return L * _attention_weights(c) + per_token_mlp + c.vocab_size * c.dim


def attention_context(c: ModelConfig, seq_len: int | None = None) -> int:
    T = seq_len or c.max_seq_len
    return min(T, c.sliding_window) if c.sliding_window else T


def flops_per_token(c: ModelConfig, seq_len: int | None = None, *, training: bool = True) -> int:
    """Model FLOPs per token at context `seq_len` (default max_seq_len); training = fwd + bwd."""
    T = attention_context(c, seq_len)
    forward = 2 * matmul_params(c) + 4 * c.n_layers * c.n_heads * c.hdim * T
    return 3 * forward if training else forward


def weight_memory(c: ModelConfig) -> dict[str, int]:
    """Bytes of the weights alone (no activations, optimizer state or KV cache)."""
    n = param_counts(c).total
    return {name: n * b for name, b in BYTES.items()}


def model_stats(c: ModelConfig, seq_len: int | None = None) -> dict:
    """Everything `astrai info` shows, as plain JSON-able values."""
    T = seq_len or c.max_seq_len
    return {
        "params": param_counts(c).as_dict(),
        "flops_per_token": {
            "seq_len": T,
            "attention_context": attention_context(c, T),
            "matmul_params": matmul_params(c),
            "forward": flops_per_token(c, T, training=False),
            "training": flops_per_token(c, T, training=True),
        },
        "weight_memory_bytes": weight_memory(c),
    }
