"""The chat request's fields that only inform, and those refused with a 400 naming them.

Their treatments (and the reasons the refusals give) are in ``openai_fields.py``. An informational
field is checked as OpenAI checks it and then has no effect beyond what its treatment says; a
refused field is accepted only in the forms that ask for nothing (absent, ``null``, an empty
``functions`` list, ``function_call: "none"``), so a client is never silently given less than it
asked for. The tool-calling fields that work are in ``tool_schemas.ChatTools``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from cluster.edge.openai_fields import CHAT, refusal, unsupported

MAX_METADATA = 16
MetadataValue = Annotated[str, Field(max_length=512)]


class ChatInforms(BaseModel):
    """Accepted, and informational only."""

    model_config = ConfigDict(extra="forbid")

    metadata: dict[str, MetadataValue] | None = Field(default=None, description=CHAT["metadata"].note)
    store: bool | None = Field(default=None, description=CHAT["store"].note)
    service_tier: str | None = Field(default=None, max_length=32, description=CHAT["service_tier"].note)
    prompt_cache_key: str | None = Field(
        default=None, max_length=1024, description=CHAT["prompt_cache_key"].note
    )
    prompt_cache_retention: str | None = Field(default=None, max_length=32)
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = Field(default=None, max_length=256)
    verbosity: Literal["low", "medium", "high"] | None = None
    reasoning_effort: str | None = Field(
        default=None, max_length=32, description=CHAT["reasoning_effort"].note
    )
    prediction: dict[str, Any] | None = Field(default=None, description=CHAT["prediction"].note)
    modalities: list[Literal["text", "audio"]] | None = None

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is not None and (len(v) > MAX_METADATA or any(len(k) > 64 for k in v)):
            raise ValueError(f"metadata takes at most {MAX_METADATA} pairs, keys of at most 64 characters")
        return v

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and "audio" in v:
            raise unsupported(CHAT["audio"].note)
        return v


class ChatRefuses(BaseModel):
    """Refused unless they ask for nothing (see ``openai_fields.CHAT`` for each reason)."""

    model_config = ConfigDict(extra="forbid")

    audio: dict[str, Any] | None = None
    moderation: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None

    @field_validator("audio", "moderation", "web_search_options")
    @classmethod
    def _refused(cls, v: Any, info: ValidationInfo) -> Any:
        if v is not None:
            raise refusal(str(info.field_name))
        return v

    @field_validator("functions")
    @classmethod
    def _no_functions(cls, v: list | None, info: ValidationInfo) -> list | None:
        if v:
            raise refusal(str(info.field_name))
        return v

    @field_validator("function_call")
    @classmethod
    def _choose_none(cls, v: str | dict | None, info: ValidationInfo) -> str | dict | None:
        if v is not None and v != "none":
            raise refusal(str(info.field_name))
        return v
