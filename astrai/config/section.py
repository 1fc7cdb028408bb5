"""Config sections and their flat names (docs/train.md "Options").

`TrainConfig` is nested by concern, as torchtitan's job config is: `optimizer.max_lr`,
`lora.rank`, `alignment.rollout.max_tokens`. The command line and flat config files keep
one name per field, made by a rule: the section's `flag_prefix` + the field name
(`lora.rank` -> `lora_rank`, `--lora-rank`), with a section's few exceptions declared
once in its `flag_names` (`optimizer.name` -> `optimizer`). `flat_fields` lists every flat
name with its path; `nest` turns a mapping of flat keys (or a mix) into the nested form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import ConfigDict
from pydantic.fields import FieldInfo

from astrai.typed_config import TypedConfig


class Section(TypedConfig):
    """A part of a config, one concern; its fields' flat names come from the class vars."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True,
                              validate_assignment=True)

    flag_prefix: ClassVar[str] = ""
    """Put before each field name to make its flat name (`lora_` + `rank`)."""
    flag_names: ClassVar[dict[str, str]] = {}
    """Fields whose flat name breaks the rule: field -> flat name."""
    panel: ClassVar[str] = ""
    """Title of the section's `astrai train --help` panel."""


@dataclass(frozen=True)
class FlatField:
    """A field as the command line and flat config files name it."""

    path: tuple[str, ...]
    """Attribute path from the top config (`("optimizer", "max_lr")`)."""
    field: FieldInfo
    panel: str
    """--help panel: the title of the section holding the field."""


def section_type(field: FieldInfo) -> type[Section] | None:
    """The Section class a field holds, or None for a plain field."""
    t = field.annotation
    return t if isinstance(t, type) and issubclass(t, Section) else None


def flat_fields(cls: type[TypedConfig], prefix: str = "", path: tuple[str, ...] = (),
                panel: str = "") -> dict[str, FlatField]:
    """Every leaf field of `cls` by flat name, in class order (sections in place)."""
    names = getattr(cls, "flag_names", {})
    out: dict[str, FlatField] = {}
    for name, field in cls.model_fields.items():
        sub = section_type(field)
        if sub is not None:
            out.update(flat_fields(sub, prefix + sub.flag_prefix, (*path, name),
                                   sub.panel or panel))
            continue
        flat = names.get(name, prefix + name)
        out[flat] = FlatField((*path, name), field, panel)
    return out


def _put(out: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        node = out.get(key)
        if isinstance(node, Section):  # a section given as an object, then flat keys of it
            node = out[key] = node.model_dump()
        elif not isinstance(node, dict):
            node = out[key] = {}
        out = node
    out[path[-1]] = value


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`base` with `extra`'s values on top, sections merged key by key."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key in out:
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def is_section_value(cls: type[TypedConfig], key: str, value: Any) -> bool:
    """`key: {...}` (or a Section object) names a section of `cls` (`optimizer: {max_lr:
    1e-3}`); another value under a section's name is that name's flat field (`optimizer:
    muon`)."""
    field = cls.model_fields.get(key)
    return (field is not None and section_type(field) is not None
            and isinstance(value, (dict, Section)))


def nest(cls: type[TypedConfig], data: dict[str, Any]) -> dict[str, Any]:
    """Flat keys (`max_lr`) moved to their sections (`optimizer: {max_lr}`); sections given
    nested are kept, and merged with flat keys of theirs; unknown keys stay for the
    validator to name."""
    flat = flat_fields(cls)
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Section) and key not in out:
            out[key] = value  # kept as is (pydantic's validate_assignment passes these)
        elif is_section_value(cls, key, value):
            if isinstance(value, Section):
                value = value.model_dump()
            out = merge(out, {key: value})
        elif key in flat:
            _put(out, flat[key].path, value)
        else:
            out[key] = value
    return out


def unknown_keys(cls: type[TypedConfig], data: dict[str, Any],
                 path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Paths of the keys of `data` (flat or nested form) that name no field of `cls`."""
    flat = flat_fields(cls) if not path else {}
    bad = []
    for key, value in data.items():
        field = cls.model_fields.get(key)
        sub = section_type(field) if field is not None else None
        if sub is not None and isinstance(value, dict):
            bad += unknown_keys(sub, value, (*path, key))
        elif key not in flat and field is None:
            bad.append((*path, key))
    return bad


def flag(path: tuple[str, ...], cls: type[TypedConfig]) -> str:
    """The long option of the field at `path` (`("lora", "rank")` -> `--lora-rank`)."""
    name = next(n for n, f in flat_fields(cls).items() if f.path == path)
    return "--" + name.replace("_", "-")
