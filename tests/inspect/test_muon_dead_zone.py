"""A Muon run's dead zone: the hidden matrices Muon stepped count at Muon's lr, the rest
(embeddings, head, gains) at AdamW's lr (closed form over the saved tensors)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from astrai.config.train import TrainConfig
from astrai.inspect import inspect_weights
from astrai.inspect.bf16 import dead_zone_mask
from astrai.inspect.names import is_muon_matrix, parse_name
from astrai.inspect.testing import fresh_state, tiny_config, write_checkpoint
from astrai.model import build_model
from astrai.train.param_groups import is_hidden_matrix
from astrai_cli.commands.inspect_cmd import render_report

ADAMW_LR, MUON_LR = 2e-3, 2e-2


def _checkpoint(tmp_path, cfg, optimizer: str, nested: bool = True):
    """A checkpoint whose meta.json's train_config is the nested form runs save now, or
    the flat form of older runs."""
    state = fresh_state(cfg, seed=0)
    # |w| = 2 is in AdamW-lr's dead zone (|w| >= 1 at 2e-3) but not Muon-lr's (>= 8).
    state["layers.0.attn.q_proj.weight"][:4] = 2.0
    state["embed_tokens.weight"][:2] = 2.0
    flat = {"optimizer": optimizer, "max_lr": ADAMW_LR, "muon_lr": MUON_LR}
    if optimizer != "muon":
        flat.pop("muon_lr")
    saved = TrainConfig.from_dict(flat).to_dict() if nested else flat
    meta = {"step": 5, "train_config": saved}
    return write_checkpoint(tmp_path / optimizer, state, cfg, meta=meta), state


@pytest.mark.parametrize("nested", [True, False])
def test_muon_run_counts_hidden_matrices_at_muon_lr(tmp_path, nested):
    cfg = tiny_config()
    path, state = _checkpoint(tmp_path, cfg, "muon", nested)
    scan = inspect_weights([path]).scans[0]
    assert (scan.lr, scan.muon_lr) == (ADAMW_LR, MUON_LR)
    z = scan.dead_zone[0]
    hidden = {n for n, v in state.items() if is_muon_matrix(parse_name(n, v.ndim), v.ndim)}
    want = sum(int(dead_zone_mask(v, MUON_LR if n in hidden else ADAMW_LR).sum())
               for n, v in state.items())
    assert (z.lr, z.muon_lr, z.entries) == (ADAMW_LR, MUON_LR, want)
    assert scan.dead_zone[1].muon_lr is None  # the ladder: one lr for every tensor
    adamw = inspect_weights([_checkpoint(tmp_path, cfg, "adamw", nested)[0]]).scans[0]
    assert adamw.muon_lr is None
    # The planted |w| = 2 rows of q_proj: dead at AdamW's lr, alive at Muon's.
    assert adamw.dead_zone[0].entries - z.entries == 4 * cfg.dim
    buf = io.StringIO()
    render_report(inspect_weights([path]), Console(file=buf, width=200), False)
    assert "0.002 / 0.02 (run)" in buf.getvalue()
    assert "Muon lr 0.02 on the hidden matrices" in buf.getvalue()


def test_hidden_matrices_are_the_ones_muon_trains():
    cfg = tiny_config(n_experts=2, moe_top_k=1)  # the router is no hidden matrix
    model = build_model(cfg, seed=0)
    for name, p in model.named_parameters():
        assert is_muon_matrix(parse_name(name, p.ndim), p.ndim) == is_hidden_matrix(name, p)
