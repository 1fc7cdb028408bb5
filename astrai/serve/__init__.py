"""The OpenAI-compatible HTTP server over infer/'s Engine (`astrai serve`); no model logic.

Public API: `ServeConfig`, `Server`, `serve` (see docs/serve.md).
"""

from astrai.serve.config import ServeConfig
from astrai.serve.server import Server, load_engine, serve

__all__ = ["ServeConfig", "Server", "load_engine", "serve"]
