"""Server-sent events as OpenAI streams them: ``data: <json>`` lines, then ``data: [DONE]``."""

from pydantic import BaseModel

DONE = "data: [DONE]\n\n"


def event(body: BaseModel) -> str:
    return f"data: {body.model_dump_json()}\n\n"
