"""`--reward module:function` (or `path/to/file.py:function`): a user reward callable.

The callable is `(prompts, completions, **record) -> list[float]`, one float per
completion. A function without **kwargs receives only the record columns it names.
Loading problems are one-line ConfigErrors naming the spec and the fix (exit 2).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from astrai.errors import ConfigError


def _import_file(path: Path, spec: str) -> Any:
    if not path.is_file():
        raise ConfigError(f"--reward {spec}: file {path} not found")
    name = f"astrai_user_reward_{abs(hash(str(path.resolve())))}"
    mod_spec = importlib.util.spec_from_file_location(name, path)
    if mod_spec is None or mod_spec.loader is None:
        raise ConfigError(f"--reward {spec}: {path} is not a Python file")
    module = importlib.util.module_from_spec(mod_spec)
    try:
        mod_spec.loader.exec_module(module)
    except Exception as e:
        raise ConfigError(f"--reward {spec}: importing {path} failed: "
                          f"{type(e).__name__}: {e}") from e
    return module


def _import_module(name: str, spec: str) -> Any:
    # The `astrai` script does not put the working directory on sys.path (python -m does);
    # a reward module next to the user's data should import all the same.
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
            raise ConfigError(
                f"--reward {spec}: no module named '{name}'; run from the directory that holds "
                f"it, install it, or give a file: path/to/file.py:function") from None
        raise ConfigError(f"--reward {spec}: importing '{name}' failed: {e}") from e
    except Exception as e:
        raise ConfigError(f"--reward {spec}: importing '{name}' failed: "
                          f"{type(e).__name__}: {e}") from e
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def load_user_reward(spec: str) -> Callable[..., list[float]]:
    """The callable named by 'module:function' or 'file.py:function'."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr.isidentifier():
        raise ConfigError(f"--reward {spec}: expected module:function or file.py:function")
    if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
        module = _import_file(Path(module_name), spec)
    else:
        module = _import_module(module_name, spec)
    fn = getattr(module, attr, None)
    if fn is None:
        raise ConfigError(f"--reward {spec}: '{module_name}' has no attribute '{attr}'")
    if not callable(fn):
        raise ConfigError(f"--reward {spec}: '{attr}' is a {type(fn).__name__}, not a function")
    return accepting(fn, spec)


def accepting(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """fn, called with only the record columns it accepts (all when it takes **kwargs)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return fn
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return fn
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2 and not any(p.kind is p.VAR_POSITIONAL for p in params):
        raise ConfigError(f"--reward {name}: the function must take (prompts, completions, "
                          "**record); it takes fewer than two arguments")
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}

    def call(prompts, completions, **record):
        return fn(prompts, completions, **{k: v for k, v in record.items() if k in named})

    call.__name__ = getattr(fn, "__name__", name)
    return call
