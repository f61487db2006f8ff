"""Errors in OpenAI's JSON shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import json
from http import HTTPStatus

from fastapi.responses import JSONResponse
from pydantic import ValidationError

from reference_engine.entrypoints.openai.protocol import ErrorInfo, ErrorResponse

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class OpenAIError(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.param = message, status, param

    def body(self) -> ErrorResponse:
        return error_body(self.message, self.status, self.param)

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body().model_dump(), status_code=self.status, headers=headers)


def error_body(message: str, status: int, param: str | None = None) -> ErrorResponse:
    kind = _TYPES.get(status) or HTTPStatus(status).phrase.replace(" ", "") + "Error"
    return ErrorResponse(error=ErrorInfo(message=message, type=kind, param=param, code=status))


def sse_error(err: OpenAIError) -> str:
    """The event a stream sends when it fails after its headers went out."""
    return f"data: {json.dumps(err.body().model_dump())}\n\n"


def from_validation_error(e: ValidationError) -> OpenAIError:
    first = e.errors()[0]
    if first["type"] == "json_invalid":
        return OpenAIError(f"The request body is not valid JSON ({first['msg']}).")
    param = ".".join(str(p) for p in first["loc"]) or None
    where = f" (field {param!r})" if param else ""
    return OpenAIError(f"{first['msg']}{where}.", param=param)


def from_value_error(e: ValueError) -> OpenAIError:
    """The engine's ``ValueError``s name the offending field first, e.g. "top_p must be..."."""
    message = str(e)
    head = message.split(" ", 1)[0]
    param = head if head.isidentifier() and head.islower() else None
    return OpenAIError(message, param=param)
