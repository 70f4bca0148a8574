"""Chat messages as OpenAI clients send them, and the plain dicts the chat template renders.

Roles ``developer`` (OpenAI's newer name for ``system``), ``system``, ``user``, ``assistant`` and
``tool``; content as text or a list of text parts. An assistant message may carry ``tool_calls``
(its content then may be null), and a ``tool`` message answers one of them by ``tool_call_id``
(``tool_schemas.py``). What a text model cannot read (images, audio, files, video) and the
deprecated ``function`` messages are refused with a 400 that names the message and says why;
``openai_fields.py`` has each treatment.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from cluster.edge.openai_fields import CONTENT_PARTS, FUNCTIONS, MESSAGE, Treatment, refusal, unsupported
from cluster.edge.tool_schemas import AssistantToolCall


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str
    prompt_cache_breakpoint: dict[str, Any] | None = None  # informational: no prompt cache

    def plain(self) -> str:
        return self.text


class RefusalPart(BaseModel):
    """An assistant's earlier refusal, sent back in the conversation: read as its text."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["refusal"]
    refusal: str

    def plain(self) -> str:
        return self.refusal


_PARTS: dict[str, type[TextPart] | type[RefusalPart]] = {"text": TextPart, "refusal": RefusalPart}


def _part(raw: Any, index: int) -> TextPart | RefusalPart:
    """One content part, or the 400 saying what is wrong with it (a before-validator's error names
    the message's content, where a union's would name each of its branches)."""
    if isinstance(raw, TextPart | RefusalPart):
        return raw
    kind = raw.get("type") if isinstance(raw, dict) else None
    treatment = CONTENT_PARTS.get(kind) if isinstance(kind, str) else None
    if treatment is not None and treatment.treatment is Treatment.REFUSED:
        raise unsupported(f"content part {index}: {treatment.note}")
    model = _PARTS.get(kind) if isinstance(kind, str) else None
    if model is None:
        known = ", ".join(f"'{k}'" for k in CONTENT_PARTS)
        raise PydanticCustomError(
            "invalid_content_part",
            "content part {index}: type must be one of {known}",
            {"index": index, "known": known},
        )
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise PydanticCustomError(
            "invalid_content_part",
            "content part {index}: {where}: {msg}",
            {"index": index, "where": where, "msg": first["msg"]},
        ) from None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["developer", "system", "user", "assistant", "tool", "function"]
    content: str | list[TextPart | RefusalPart] | None = None
    name: str | None = Field(default=None, max_length=256)
    refusal: str | None = None
    audio: dict[str, Any] | None = None
    tool_calls: list[AssistantToolCall] | None = None
    function_call: dict[str, Any] | None = None
    tool_call_id: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _parts(cls, v: Any) -> Any:
        return [_part(p, i) for i, p in enumerate(v)] if isinstance(v, list) else v

    @field_validator("audio")
    @classmethod
    def _no_audio(cls, v: dict | None) -> dict | None:
        if v is not None:
            raise refusal("audio", MESSAGE)
        return v

    @model_validator(mode="after")
    def _text_roles(self) -> ChatMessage:
        if self.role == "function" or self.function_call is not None:
            raise PydanticCustomError("unsupported_parameter", f"{self.role} message: {FUNCTIONS}")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise PydanticCustomError(
                "invalid_tool_message", "a tool message needs tool_call_id, and only tool messages take it"
            )
        if self.tool_calls and self.role != "assistant":
            raise PydanticCustomError("invalid_tool_calls", "tool_calls belong to assistant messages")
        if self.content is None and self.role != "assistant":
            raise PydanticCustomError("missing_content", f"a {self.role} message needs content")
        parts = self.content if isinstance(self.content, list) else []
        if self.role != "assistant" and any(isinstance(p, RefusalPart) for p in parts):
            raise unsupported("refusal content parts belong to assistant messages")
        return self

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        text = "".join(part.plain() for part in self.content or [])
        return text or (self.refusal or "")

    def template_dict(self) -> dict[str, Any]:
        """What the chat template reads: the template knows system/user/assistant/tool, so
        ``developer`` goes in as ``system``; ``name`` rides along for templates that use it, and an
        assistant's calls and a tool message's call id as transformers passes them."""
        out: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": self.text(),
        }
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [call.template_dict() for call in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out
