"""Errors in the shape OpenAI's API gives them: ``{"error": {"message", "type", "param", "code"}}``,
with the HTTP status a client library maps to its exception classes."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

# The engine's failures (``Failed.kind``, an exception class name) as (status, type, code).
ENGINE_ERRORS: dict[str, tuple[int, str, str]] = {
    "PromptTooLongError": (400, "invalid_request_error", "context_length_exceeded"),
    "MemoryLimitError": (503, "server_error", "insufficient_memory"),
    "LanesError": (400, "invalid_request_error", "invalid_request"),
    "EngineStopped": (503, "server_error", "engine_stopped"),
}


class ApiError(Exception):
    """An answer other than 200, with a message a person can act on."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def engine_error(kind: str, message: str) -> ApiError:
    """The API error for an engine failure; one the engine did not foresee is a 500 with its message."""
    status, type_, code = ENGINE_ERRORS.get(kind, (500, "server_error", "engine_error"))
    return ApiError(status, message, type_, code)
