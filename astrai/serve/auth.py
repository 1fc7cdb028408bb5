"""The API key: which keys a server accepts, and the bearer-token check of each request.

HTTP header values are bytes; Starlette hands them over decoded as latin-1, and a client
sends a key as its UTF-8 bytes (curl, httpx, the openai client). So the check compares
bytes: the header's raw bytes (the latin-1 text encoded back) with the key's UTF-8. Any
key that is not a match, whatever its encoding, is a 401 and never an exception.
"""

from __future__ import annotations

import hmac

from astrai.serve.address import is_loopback


def key_problem(key: str | None) -> str | None:
    """Why `key` cannot be an API key (a one-line reason), or None when it can."""
    if key is None:
        return None
    if not key:
        return ("--api-key (or ASTRAI_API_KEY) is empty: give a key, or leave both unset "
                "to serve without one")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return "--api-key is not valid UTF-8 text: give the key as text"
    if key != key.strip() or any(ord(c) < 32 or ord(c) == 127 for c in key):
        return ("--api-key has leading or trailing spaces or control characters, which an "
                "Authorization header cannot carry: remove them")
    return None


def authorized(header: str | None, key: bytes) -> bool:
    """Whether an `Authorization` header value carries `Bearer <key>` (key as UTF-8)."""
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    # latin-1 maps every header byte to one character and back, so this never fails;
    # strip ASCII blanks only: U+00A0 is also the last byte of some UTF-8 characters
    return hmac.compare_digest(token.strip(" \t").encode("latin-1"), key)


def open_warning(host: str, key: str | None) -> str | None:
    """A warning when the server listens beyond this machine with no key, else None."""
    if key is not None or is_loopback(host):
        return None
    return (f"--host {host} without --api-key: anyone who can reach this port can use "
            "the model; set --api-key (or ASTRAI_API_KEY)")
