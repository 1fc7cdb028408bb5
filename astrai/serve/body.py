"""Request body bytes -> JSON value, refusing what the rest of the server cannot take.

Two inputs that `json.loads` accepts (or nearly) would otherwise surface as a 500 further
on: nesting deeper than Python's recursion limit (RecursionError in the decoder), and a
lone UTF-16 surrogate such as "\\udfff", which JSON allows as an escape but which is no
Unicode text (the tokenizer and the UTF-8 response encoder raise on it). Both are a 400
here. The decode runs in a worker thread (app.py), never on the event loop.
"""

from __future__ import annotations

import json
import re
from typing import Any

from astrai.serve.errors import bad_request

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def decode_json(raw: bytes) -> Any:
    """The JSON value of a request body; APIError 400 on anything that is not JSON text."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"the body is not valid JSON: {e}") from None
    except RecursionError:
        raise bad_request("the body is nested too deeply to be a request") from None
    if _SURROGATE_ESCAPE.search(raw):  # a pair decodes to one character; a lone one stays
        where = _lone_surrogate(body)
        if where is not None:
            raise bad_request(f"{where or 'the body'} holds a lone UTF-16 surrogate escape "
                              "(\\ud800-\\udfff), which is not Unicode text; send valid "
                              "text", where or None)
    return body


def _lone_surrogate(body: Any) -> str | None:
    """Where (a field path like "messages[0].content", "" for the top) the first string
    holding a surrogate is, or None. Iterative: the value may be nested ~1000 deep."""
    todo: list[tuple[str, Any]] = [("", body)]
    while todo:
        where, v = todo.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                return where
        elif isinstance(v, dict):
            for k, x in v.items():
                if _SURROGATE.search(k):
                    return where
                todo.append((f"{where}.{k}" if where else k, x))
        elif isinstance(v, list):
            todo.extend((f"{where}[{i}]", x) for i, x in enumerate(v))
    return None
