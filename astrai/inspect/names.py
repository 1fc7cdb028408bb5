"""What a tensor name says: its layer, its kind across layers, and its role.

Works on astrai names (`layers.3.attn.k_proj.weight`) and HF names
(`model.layers.3.self_attn.k_proj.weight`) alike, so the same report groups both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)\.")
_EMBED = re.compile(r"(?:^|\.)(?:embed_tokens|wte|tok_embeddings|word_embeddings)\.weight$")
_HEAD = re.compile(r"(?:^|\.)(?:lm_head|output)\.weight$")
# The hidden matrices astrai's Muon trains (astrai.train.param_groups.is_hidden_matrix, which
# tests hold this to): 2-D weights of a block's attention or MLP, the MoE router excepted.
_HIDDEN = re.compile(r"(?:^|\.)layers\.\d+\.(?:attn|mlp)\.(?!router\.).*weight$")


@dataclass(frozen=True)
class ParamName:
    """A tensor name taken apart."""

    name: str
    """The full tensor name as stored."""
    layer: int | None
    """Block index, or None outside the blocks (embedding, final norm, head)."""
    kind: str
    """The name with the block index wildcarded (`layers.*.attn.k_proj.weight`)."""
    role: str
    """embedding | lm_head | matrix (2-D and up) | gain (1-D: norm gains, biases) | scalar."""

    @property
    def short(self) -> str:
        """A compact kind for tables: `attn.k_proj`, `embed_tokens`, `lm_head`."""
        k = self.kind.removeprefix("model.")
        k = re.sub(r"^(?:.*\.)?(?:layers|h|blocks|layer)\.\*\.", "", k)
        return k.removesuffix(".weight")

    @property
    def by_token(self) -> bool:
        """Rows are token ids (input embedding or output head)."""
        return self.role in ("embedding", "lm_head")


def parse_name(name: str, ndim: int) -> ParamName:
    m = _LAYER.search(name)
    layer = int(m.group(1)) if m else None
    kind = name[: m.start(1)] + "*" + name[m.end(1):] if m else name
    if ndim >= 2 and _EMBED.search(name):
        role = "embedding"
    elif ndim >= 2 and _HEAD.search(name):
        role = "lm_head"
    elif ndim >= 2:
        role = "matrix"
    elif ndim == 1:
        role = "gain"
    else:
        role = "scalar"
    return ParamName(name, layer, kind, role)


def is_muon_matrix(param: ParamName, ndim: int) -> bool:
    """Whether an astrai run with `optimizer: muon` updated this tensor with Muon (at
    muon_lr) rather than AdamW (at the run's lr)."""
    return ndim == 2 and _HIDDEN.search(param.name) is not None


_WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_fsdp_wrapped_module.",
                     "_checkpoint_wrapped_module.")


def clean_name(name: str) -> str:
    """A live parameter's name as the checkpoint stores it: DDP / torch.compile / FSDP1 /
    activation-checkpoint wrappers add prefixes."""
    for p in _WRAPPER_PREFIXES:
        name = name.replace(p, "")
    return name
