"""User-facing errors.

A user mistake raises an `AstraiError` subclass whose message names the file, line or
field and says what to do. The CLI prints the message on one line and exits 2.
"""


class AstraiError(Exception):
    """A mistake the user can fix; the message says where and how."""

    exit_code = 2


class ConfigError(AstraiError):
    """An invalid or inconsistent configuration value."""


class CheckpointError(AstraiError):
    """A checkpoint directory or weight file that is missing, incomplete or corrupt."""


class DataError(AstraiError):
    """Bad input data: malformed records, missing fields, empty input."""


class UnsupportedModelError(AstraiError):
    """A model format or architecture astrai does not support."""


class NoTemplateError(ConfigError):
    """A chat path needs a chat template and the tokenizer ships none."""


class MissingExtraError(AstraiError):
    """An optional dependency is not installed; the message names the pip extra to install."""
