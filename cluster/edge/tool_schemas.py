"""OpenAI's tool-calling fields at the edge: the tools, the choice, and the calls in the conversation.

``tools`` holds function tools (a name of 1-64 letters, digits, ``_`` or ``-``, unique; a JSON-schema
``parameters`` object, checked against its metaschema in ``tool_grammar.py``). ``tool_choice`` is
``"none"``, ``"auto"``, ``"required"`` or ``{"type": "function", "function": {"name": ...}}`` naming
one of the tools. An assistant message's ``tool_calls`` carry JSON-object arguments; each call is
answered by a ``tool`` message (``tool_call_id``) before the conversation goes on (``history_problem``).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from cluster.edge.openai_fields import CHAT

NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
MAX_TOOLS = 128  # OpenAI's limit


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionDefinition(_Strict):
    name: str = Field(pattern=NAME_PATTERN, description="The function's name (letters, digits, _ and -).")
    description: str | None = Field(default=None, description="What the function does, for the model.")
    parameters: dict[str, Any] | None = Field(
        default=None, description="A JSON Schema of its arguments (an object); left out: no arguments."
    )
    strict: bool | None = Field(default=None, description="Accepted; forced calls always match the schema.")


class FunctionTool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition

    def template_dict(self) -> dict[str, Any]:
        """The tool as chat templates read it (transformers passes JSON-schema tools as they are)."""
        return {"type": "function", "function": self.function.model_dump(exclude_none=True)}


class ChosenFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: ChosenFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(_Strict):
    name: str = Field(pattern=NAME_PATTERN)
    arguments: str = Field(description="The arguments the model wrote: a JSON object, as text.")

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, v: str) -> str:
        try:
            value = json.loads(v)
        except ValueError:
            raise ValueError("arguments must be a JSON object written as text") from None
        if not isinstance(value, dict):
            raise ValueError("arguments must be a JSON object written as text")
        return v


class AssistantToolCall(_Strict):
    """A call an earlier assistant message made, sent back in the conversation."""

    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"]
    function: CalledFunction

    def template_dict(self) -> dict[str, Any]:
        """As templates read a call: arguments as an object (Llama 3.1 and Qwen write it with tojson)."""
        function = {"name": self.function.name, "arguments": json.loads(self.function.arguments)}
        return {"id": self.id, "type": "function", "function": function}


class ChatTools(BaseModel):
    """The chat request's tool fields (a mixin of ``ChatCompletionRequest``)."""

    model_config = ConfigDict(extra="forbid")

    tools: list[FunctionTool] | None = Field(
        default=None, max_length=MAX_TOOLS, description=CHAT["tools"].note
    )
    tool_choice: ToolChoice | None = Field(default=None, description=CHAT["tool_choice"].note)
    parallel_tool_calls: bool | None = Field(default=None, description=CHAT["parallel_tool_calls"].note)

    @field_validator("tools")
    @classmethod
    def _unique_names(cls, v: list[FunctionTool] | None) -> list[FunctionTool] | None:
        names = [t.function.name for t in v or ()]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise PydanticCustomError(
                "duplicate_tool_name", "tool names must be unique: {names}", {"names": twice}
            )
        return v

    @field_validator("tool_choice")
    @classmethod
    def _choice_among_tools(cls, v: ToolChoice | None, info: ValidationInfo) -> ToolChoice | None:
        if "tools" not in info.data:
            return v  # the tools were refused: that error is the one to report
        names = [t.function.name for t in info.data["tools"] or ()]
        if (v == "required" or isinstance(v, NamedToolChoice)) and not names:
            raise PydanticCustomError("invalid_tool_choice", "this tool_choice needs tools")
        if isinstance(v, NamedToolChoice) and v.function.name not in names:
            raise PydanticCustomError(
                "invalid_tool_choice",
                "tool_choice names the function '{name}', which is not one of the tools",
                {"name": v.function.name},
            )
        return v

    @property
    def tool_mode(self) -> Literal["off", "auto", "forced"]:
        """off: no tools (or tool_choice none); auto: the model decides; forced: a grammar makes it call."""
        if not self.tools or self.tool_choice == "none":
            return "off"
        return "auto" if self.tool_choice in (None, "auto") else "forced"

    @property
    def parallel_calls(self) -> bool:
        return self.parallel_tool_calls is not False

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools the prompt shows: none when tool_choice is none (the model is to answer in text)."""
        return [t.template_dict() for t in self.tools or ()] if self.tool_mode != "off" else None


def with_call_names(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Template messages whose tool results carry the called function's ``name`` where the client
    gave none (OpenAI's tool messages have no name; Hermes templates require one)."""
    names = {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls") or ()}
    for message in messages:
        if message["role"] == "tool" and "name" not in message and message.get("tool_call_id") in names:
            message["name"] = names[message["tool_call_id"]]
    return messages


def history_problem(messages: list[Any]) -> tuple[int, str] | None:
    """(index, why) of the first message that breaks the calls' order, or None. Each assistant call
    is answered by one tool message before any other message; a tool message answers an open call."""
    open_calls: dict[str, int] = {}
    for i, message in enumerate(messages):
        if message.role == "tool":
            if message.tool_call_id not in open_calls:
                return i, f"tool message answers no open tool call (tool_call_id {message.tool_call_id!r})"
            del open_calls[message.tool_call_id]
            continue
        if open_calls:
            return _dangling(open_calls)
        for call in message.tool_calls or ():
            if call.id in open_calls:
                return i, f"tool call id {call.id!r} is used twice"
            open_calls[call.id] = i
    return _dangling(open_calls) if open_calls else None


def _dangling(open_calls: dict[str, int]) -> tuple[int, str]:
    call_id, index = next(iter(open_calls.items()))
    return index, (
        f"the assistant's tool call {call_id!r} has no tool message answering it "
        "(each call's result comes in a `tool` message right after the assistant message)"
    )
