"""TypedConfig: the one base of astrai's option objects (docs/architecture.md "Configs").

Every config — model shapes, preprocess specs, training runs, the engine, the server,
quickstart, inspect-weights — is a pydantic model built on this class, so each refuses
unknown keys, refuses a boolean where a number is expected (in lax mode pydantic reads
`true` as 1: `max_seq_len: true` would pass as 1), and turns a validation failure into one
line naming each bad field: `source: field: what is wrong; other.field: ...`. Build from user
input with `Config.from_dict(data, source)` (a ConfigError); `Config(**fields)` raises
pydantic's ValidationError, for values the code itself chose.
"""

from __future__ import annotations

import typing
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

from astrai.errors import ConfigError

MAX_LISTED = 5
"""Validation errors named in one message; the rest are counted."""


def format_validation_error(e: ValidationError, unknown_key_hint: str = "") -> str:
    """One line naming each bad field (at most MAX_LISTED) and what is wrong with it; an
    unknown key says so and ends with `unknown_key_hint` (where the valid keys are listed)."""
    errors = e.errors()
    parts = []
    for err in errors[:MAX_LISTED]:
        loc = ".".join(str(p) for p in err["loc"]) or "config"
        if err["type"] == "extra_forbidden":
            hint = f"; {unknown_key_hint}" if unknown_key_hint else ""
            parts.append(f"{loc}: unknown key, check the spelling{hint}")
        else:
            parts.append(f"{loc}: {err['msg'].removeprefix('Value error, ')}")
    more = f" (+{len(errors) - MAX_LISTED} more)" if len(errors) > MAX_LISTED else ""
    return "; ".join(parts) + more


def _numeric(annotation: Any) -> bool:
    args = typing.get_args(annotation)
    return annotation in (int, float) or any(a in (int, float) for a in args)


def _bool_ok(annotation: Any) -> bool:
    return annotation is bool or any(a is bool for a in typing.get_args(annotation))


class TypedConfig(BaseModel):
    """Strict keys, numbers that are numbers, one-line errors (`from_dict`)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    unknown_key_hint: ClassVar[str] = ""
    """Appended to an unknown-key error: where the valid keys are listed."""
    config_name: ClassVar[str] = "config"
    """What `from_dict`'s errors name when no source is given."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and _numeric(field.annotation) and not _bool_ok(field.annotation):
                raise ValueError(f"expected a number, got {str(value).lower()}")
        return value

    @classmethod
    def from_dict(cls, data: Any, source: str | None = None) -> typing.Self:
        """Validate a mapping; a ConfigError `source: field: problem` when it is wrong
        (`source` defaults to the class's config_name)."""
        source = source or cls.config_name
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise ConfigError(f"{source}: {format_validation_error(e, cls.unknown_key_hint)}"
                              ) from None
