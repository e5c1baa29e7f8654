"""The OpenAPI document at /openapi.json, built from the same pydantic
models that validate requests, so the document cannot drift from the code."""

from typing import Any

from sluice.gateway.schemas import ChatCompletionRequest, CompletionRequest

ERROR_SCHEMA = {
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

ERRORS = {
    "400": "Invalid request (malformed JSON, a bad field, or context_length_exceeded)",
    "401": "Missing or invalid API key",
    "403": "An admin key is needed to read another tenant's usage",
    "404": "Unknown model",
    "409": "A request with this Idempotency-Key is still running",
    "413": "Request body too large",
    "429": "Over a rate limit or capacity; see Retry-After, retry-after-ms and x-sluice-reject-reason",
    "503": "Nothing can serve it right now (no replica, a hop unreachable); see Retry-After and retry-after-ms",
}


def _errors(codes: list[str]) -> dict[str, Any]:
    return {
        code: {
            "description": ERRORS[code],
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
        for code in codes
    }


def _json_body(model: type) -> tuple[dict[str, Any], dict[str, Any]]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    definitions = schema.pop("$defs", {})
    return schema, definitions


def openapi_document() -> dict[str, Any]:
    chat_schema, chat_defs = _json_body(ChatCompletionRequest)
    completion_schema, completion_defs = _json_body(CompletionRequest)
    generation_responses = {
        "200": {
            "description": "A completion (JSON), or a stream of server-sent events ending with `data: [DONE]`",
            "content": {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {}},
        },
        **_errors(["400", "401", "404", "409", "413", "429", "503"]),
    }
    idempotency = {
        "name": "Idempotency-Key", "in": "header", "required": False, "schema": {"type": "string", "maxLength": 255},
        "description": "Retries with the same key are billed once; a finished response is replayed.",
    }
    security = [{"bearer": []}]
    return {
        "openapi": "3.1.0",
        "info": {"title": "Sluice", "version": "0.1.0",
                 "description": "OpenAI-compatible multi-tenant LLM inference."},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": ERROR_SCHEMA, "ChatCompletionRequest": chat_schema,
                        "CompletionRequest": completion_schema, **chat_defs, **completion_defs},
        },
        "paths": {
            "/v1/chat/completions": {"post": {
                "summary": "Create a chat completion", "security": security, "parameters": [idempotency],
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/ChatCompletionRequest"}}}},
                "responses": generation_responses,
            }},
            "/v1/completions": {"post": {
                "summary": "Create a text completion", "security": security, "parameters": [idempotency],
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/CompletionRequest"}}}},
                "responses": generation_responses,
            }},
            "/v1/models": {"get": {
                "summary": "List models", "security": security,
                "responses": {"200": {"description": "The model catalog",
                                      "content": {"application/json": {"schema": {"type": "object"}}}},
                              **_errors(["401", "503"])},
            }},
            "/v1/models/{model}": {"get": {
                "summary": "Retrieve a model", "security": security,
                "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "The model",
                                      "content": {"application/json": {"schema": {"type": "object"}}}},
                              **_errors(["401", "404", "503"])},
            }},
            "/v1/usage": {"get": {
                "summary": "Token usage of the caller's tenant from the billing ledger", "security": security,
                "parameters": [
                    {"name": "start", "in": "query", "required": False, "schema": {"type": "string"},
                     "description": "unix seconds or ISO 8601; default 30 days before end"},
                    {"name": "end", "in": "query", "required": False, "schema": {"type": "string"},
                     "description": "unix seconds or ISO 8601 (exclusive); default now"},
                    {"name": "group_by", "in": "query", "required": False,
                     "schema": {"type": "string", "enum": ["model", "day", "model,day"]}},
                    {"name": "tenant", "in": "query", "required": False, "schema": {"type": "string"},
                     "description": "admin keys only: another tenant, or * for all"},
                ],
                "responses": {"200": {"description": "Usage buckets",
                                      "content": {"application/json": {"schema": {"type": "object"}}}},
                              **_errors(["400", "401", "403"])},
            }},
            "/healthz": {"get": {"summary": "Liveness", "responses": {"200": {"description": "Alive"}}}},
            "/health": {"get": {"summary": "Liveness (alias probed by load tools)",
                                "responses": {"200": {"description": "Alive"}}}},
            "/readyz": {"get": {"summary": "Readiness: the gateway's own stores (outbox, limits) work",
                                "responses": {"200": {"description": "Ready"},
                                              "503": {"description": "Not ready"}}}},
            "/readyz/route": {"get": {"summary": "Readiness of a route: a ready replica exists",
                                      "responses": {"200": {"description": "A route exists"},
                                                    "503": {"description": "No ready replica"}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics",
                                 "responses": {"200": {"description": "Text exposition format"}}}},
        },
    }
