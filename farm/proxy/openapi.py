"""The proxy's OpenAPI document: what each route under a trial's base URL accepts and answers.

The routes are the OpenAI and Anthropic APIs (documented by them); this document says which part of
them the proxy reads, from the same pydantic models its formats parse with, so a fuzzer (schemathesis,
``tests/integration/proxy/test_proxy_fuzz.py``) can build requests for them. Its paths are
relative to the server ``/proxy/{trial}/v1`` (verl's harnesses use ``/{trial}/v1``): give a client
the trial's base URL, and the trial's key as the API key. Served by the API at
``/proxy/openapi.json`` and by ``farm proxy`` at ``/openapi.json``.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from farm import __version__
from farm.proxy.anthropic_messages import CountTokensBody, MessagesBody
from farm.proxy.openai_chat import ChatCompletionBody
from farm.proxy.openai_completions import CompletionBody
from farm.proxy.openai_responses import ResponsesBody

#: where the document is served in the API process (``farm proxy``: ``/openapi.json``).
API_PATH = "/proxy/openapi.json"

_OPENAI_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
_ANTHROPIC_ERROR = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}
#: path: (operation id, summary, request body model, error shape, streams).
_ROUTES: dict[str, tuple[str, str, type[BaseModel], dict[str, Any], bool]] = {
    "/chat/completions": ("chat_completions", "OpenAI Chat Completions", ChatCompletionBody, _OPENAI_ERROR, True),
    "/completions": ("completions", "OpenAI legacy Completions", CompletionBody, _OPENAI_ERROR, True),
    "/responses": ("responses", "OpenAI Responses (stateless)", ResponsesBody, _OPENAI_ERROR, True),
    "/messages": ("messages", "Anthropic Messages", MessagesBody, _ANTHROPIC_ERROR, True),
    "/messages/count_tokens": (
        "messages_count_tokens",
        "Anthropic token count",
        CountTokensBody,
        _ANTHROPIC_ERROR,
        False,
    ),
}
#: what each error status means here (every route answers them in its format's shape).
_ERRORS = {
    "400": "the request cannot be served as it is: the message names the field (context_length_exceeded: "
    "shorten the conversation)",
    "401": "no API key, or not this trial's key",
    "403": "the trial has ended",
    "408": "the body was not sent within the read timeout",
    "413": "the body is larger than proxy.max_body_bytes",
}


@cache
def proxy_openapi() -> dict[str, Any]:
    """The document (built once; callers must not change it)."""
    models = [(model, "validation") for _, _, model, _, _ in _ROUTES.values()]
    refs, defs = models_json_schema(models, ref_template="#/components/schemas/{model}")  # type: ignore[arg-type]
    paths: dict[str, Any] = {}
    for path, (operation_id, summary, model, error, streams) in _ROUTES.items():
        answer: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
        if streams:
            # Server-sent events: each event's data is the format's JSON (OpenAI's stream ends with [DONE]).
            answer["text/event-stream"] = {"schema": {}}
        responses: dict[str, Any] = {
            "200": {"description": "the answer (streamed with `stream: true`)", "content": answer}
        }
        for status, about in _ERRORS.items():
            responses[status] = {"description": about, "content": {"application/json": {"schema": error}}}
        paths[path] = {
            "post": {
                "operationId": operation_id,
                "summary": summary,
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": refs[(model, "validation")]}},
                },
                "responses": responses,
            }
        }
    paths["/models"] = {
        "get": {
            "operationId": "models",
            "summary": "the trial's model, as OpenAI lists models",
            "responses": {
                "200": {"description": "the models", "content": {"application/json": {"schema": {"type": "object"}}}},
                "401": {"description": _ERRORS["401"], "content": {"application/json": {"schema": _OPENAI_ERROR}}},
                "403": {"description": _ERRORS["403"], "content": {"application/json": {"schema": _OPENAI_ERROR}}},
            },
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "rollout-farm proxy",
            "version": __version__,
            "description": "A trial's OpenAI- and Anthropic-compatible routes (docs/proxy.md). Each records the "
            "token ids the model sampled for the trial.",
        },
        "servers": [
            {
                "url": "/proxy/{trial}/v1",
                "variables": {"trial": {"default": "trial", "description": "the trial's id (POST /v1/trials)"}},
            }
        ],
        "security": [{"bearer": []}, {"api_key": []}],
        "paths": paths,
        "components": {
            "schemas": defs.get("$defs", {}),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "the trial's key (OpenAI SDKs)"},
                "api_key": {"type": "apiKey", "in": "header", "name": "x-api-key", "description": "the trial's key"},
            },
        },
    }
