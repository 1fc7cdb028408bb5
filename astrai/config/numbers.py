"""A pydantic mixin that refuses booleans where a number is expected.

In lax mode pydantic reads `true` as 1 for an int field, so `max_seq_len: true` would fail
later as "must be >= 2" (or pass as 1): the user meant something else and should be told.
"""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel, ValidationInfo, field_validator


def _numeric(annotation: Any) -> bool:
    if annotation in (int, float):
        return True
    return any(a in (int, float) for a in typing.get_args(annotation))


class NoBoolNumbers(BaseModel):
    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and _numeric(field.annotation) and not _bool_ok(field):
                raise ValueError(f"expected a number, got {str(value).lower()}")
        return value


def _bool_ok(field: Any) -> bool:
    return any(a is bool for a in (field.annotation, *typing.get_args(field.annotation)))
