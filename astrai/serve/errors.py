"""HTTP errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

The status codes and types follow the OpenAI API reference ("Error codes") and vLLM's
OpenAI-compatible server: 400 invalid_request_error, 401 authentication_error, 404
model not found, 413 request too large, 503 when the server cannot take more work.
"""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """A request the server refuses; rendered as OpenAI's error object."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)
