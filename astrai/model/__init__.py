"""The transformer, its config and presets."""

from astrai.model.config import ModelConfig, RopeScaling
from astrai.model.context import AttentionBackend, ForwardContext, SdpaBackend
from astrai.model.init import build_model, init_weights
from astrai.model.presets import PRESETS, get_preset
from astrai.model.transformer import ModelOutput, Transformer

__all__ = [
    "PRESETS",
    "AttentionBackend",
    "ForwardContext",
    "ModelConfig",
    "ModelOutput",
    "RopeScaling",
    "SdpaBackend",
    "Transformer",
    "build_model",
    "get_preset",
    "init_weights",
]
