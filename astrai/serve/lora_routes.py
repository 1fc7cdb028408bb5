"""LoRA adapters over HTTP: which model a request names, what /v1/models lists, and vLLM's
runtime routes POST /v1/load_lora_adapter {"lora_name", "lora_path"} and
POST /v1/unload_lora_adapter {"lora_name"}.

The runtime routes make the server read a directory of its own file system, so they exist
only when the server was started with `--enable-lora-loading` (404 otherwise) and also an
API key (403 without one): never open by default. A bad body or an adapter that cannot
load is a 400 naming the field.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

from astrai.errors import AstraiError, CheckpointError
from astrai.serve.body import decode_json
from astrai.serve.errors import APIError, bad_request


def resolve_model(state: Any, model: str | None) -> str | None:
    """The LoRA adapter a request's `model` names (None: the base); 404 model_not_found
    for a name the server does not serve."""
    if model is None or model == state.model_name:
        return None
    names = state.loop.engine.lora_names()
    if model in names:
        return model
    served = ", ".join(f"'{n}'" for n in [state.model_name, *names])
    raise APIError(404, f"the model '{model}' does not exist; this server serves {served}",
                   type="not_found_error", param="model", code="model_not_found")


def model_cards(state: Any) -> list[dict[str, Any]]:
    """/v1/models' data: the base, then each adapter with `parent` = the base (as vLLM)."""
    card = {"object": "model", "created": state.created, "owned_by": "astrai",
            "max_model_len": state.max_context}
    base = {"id": state.model_name, **card, "parent": None}
    return [base] + [{"id": n, **card, "parent": state.model_name}
                     for n in state.loop.engine.lora_names()]


def _field(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value.strip():
        raise bad_request(f"'{name}' must be a non-empty string", name)
    return value


def _body(raw: bytes, fields: tuple[str, ...]) -> dict[str, Any]:
    body = decode_json(raw)
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise bad_request(f"unknown field '{unknown[0]}'; this route takes "
                          f"{', '.join(fields)}", unknown[0])
    return body


def add_lora_routes(app: FastAPI, state: Any, auth: Any) -> None:
    """The two runtime routes (behind `auth`, the server's API-key check)."""

    def allowed(request: Request) -> None:
        if not state.lora_loading:
            raise APIError(404, "runtime LoRA loading is off; start the server with "
                           "--enable-lora-loading and --api-key to use this route",
                           type="not_found_error")
        if state.api_key is None:
            raise APIError(403, "runtime LoRA loading reads server paths and needs an API "
                           "key; restart the server with --api-key",
                           type="permission_error")
        auth(request)

    @app.post("/v1/load_lora_adapter")
    async def load(request: Request) -> PlainTextResponse:
        allowed(request)
        body = _body(await request.body(), ("lora_name", "lora_path"))
        name, path = _field(body, "lora_name"), _field(body, "lora_path")
        if name == state.model_name:
            raise bad_request(f"'lora_name' {name!r} is the base model's name", "lora_name")
        try:
            await asyncio.to_thread(state.loop.engine.add_lora, name, path)
        except CheckpointError as e:
            raise bad_request(str(e), "lora_path") from None
        except AstraiError as e:
            raise bad_request(str(e), "lora_name") from None
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload(request: Request) -> PlainTextResponse:
        allowed(request)
        body = _body(await request.body(), ("lora_name", "lora_int_id"))
        name = _field(body, "lora_name")
        try:
            await asyncio.to_thread(state.loop.engine.remove_lora, name)
        except AstraiError as e:
            raise bad_request(str(e), "lora_name") from None
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")
