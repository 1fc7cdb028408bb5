"""AdamW decay groups, gradient checkpointing equivalence, executor registry."""

import pytest
import torch

from astrai.errors import ConfigError
from astrai.model import build_model, get_preset
from astrai.model.block import DecoderBlock
from astrai.train.compile import apply_activation_checkpointing
from astrai.train.executors import EXECUTORS
from astrai.train.param_groups import decay_param_groups

from .conftest import TINY, VOCAB, collate, pretrain_samples


@pytest.mark.parametrize("tied", [False, True])
def test_weight_decay_only_on_matrices(tied):
    m = build_model(get_preset("tiny", vocab_size=VOCAB, tie_embeddings=tied,
                               **{**TINY, "qkv_bias": True}), seed=0)
    decay, no_decay = decay_param_groups(m, 0.1)
    names = {id(p): n for n, p in m.named_parameters()}
    d = {names[id(p)] for p in decay["params"]}
    nd = {names[id(p)] for p in no_decay["params"]}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert "embed_tokens.weight" in nd and "norm.weight" in nd
    assert "layers.0.attn.q_proj.bias" in nd and "layers.0.attn_norm.weight" in nd
    assert "layers.0.attn.q_proj.weight" in d and "layers.1.mlp.down_proj.weight" in d
    assert ("lm_head.weight" in d) == (not tied)
    assert len(d) + len(nd) == len(list(m.parameters()))


def test_gradient_checkpointing_same_gradients():
    cfg = get_preset("tiny", vocab_size=VOCAB, **TINY)
    batch = collate(pretrain_samples(2, 12))
    grads = []
    for ckpt in (False, True):
        m = build_model(cfg, seed=0)
        if ckpt:
            assert len(apply_activation_checkpointing(m, (DecoderBlock,))) == cfg.n_layers
        logits = m(batch["input_ids"]).logits
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["target_ids"].flatten()
                                          ).backward()
        grads.append({n: p.grad for n, p in m.named_parameters()})
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n])


def test_executor_registry():
    ex = EXECUTORS.get("none")()
    assert ex.world_size == 1 and ex.is_main
    with pytest.raises(ConfigError, match="unknown 'tpu'"):
        EXECUTORS.get("tpu")
    with pytest.raises(ConfigError, match=r"executor 'none': unknown option\(s\) bucket_mb"):
        EXECUTORS.get("none")(bucket_mb=25)
