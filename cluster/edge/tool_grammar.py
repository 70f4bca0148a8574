"""A chat request's tools checked before admission, and the grammar that forces a call.

Checks (each a 400 before any quota is taken): every tool's ``parameters`` is a schema the grammar
can enforce (``response_format.schema_problem``: its metaschema, its ``$ref``s, llguidance; the
message points into it, ``param`` ``tools.<i>.function.parameters``); the conversation's calls are
each answered (``tool_schemas.history_problem``, ``param`` ``messages.<i>``); a forced
``tool_choice`` and a JSON ``response_format`` are not asked together (both would constrain the
same answer).

A forced choice goes down ``response_format``'s path: a JSON schema in the sampling fields that
the replica enforces by grammar-constrained decoding. A named function: the call object
``{"name": <that name>, "arguments": <its parameters>}``; ``required``: any of the tools' call
objects, in an array of at least one when ``parallel_tool_calls`` (the default) allows several.
Each tool's parameters move under ``$defs`` (``tool<i>``), their own ``$defs`` beside them, with
every local ``$ref`` rewritten to match, so references in one tool's schema still resolve. An object
schema that lists ``properties`` and says nothing of others gets ``additionalProperties: false``, as
OpenAI's strict function calling has it: a JSON Schema allows any other key by default, and a small
model given that room writes keys no function takes. What the grammar allows is then a subset of
what the tool's schema allows, so every forced call still validates against it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from cluster.edge.openai_schemas import ChatCompletionRequest
from cluster.edge.response_format import schema_problem
from cluster.edge.tool_schemas import FunctionTool, NamedToolChoice, history_problem
from cluster.errors import BadRequest
from replica.grammar_spec import compact

ANY_OBJECT: dict[str, Any] = {"type": "object"}
_DEF_KEYS = ("$defs", "definitions")
_DATA_KEYS = ("enum", "const", "default", "examples")  # values there are data, not schemas
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


async def check_tool_request(body: ChatCompletionRequest) -> None:
    problem = history_problem(body.messages)
    if problem is not None:
        index, why = problem
        raise BadRequest(why, code="invalid_tool_history", param=f"messages.{index}")
    for i, tool in enumerate(body.tools or ()):
        parameters = tool.function.parameters
        if parameters is None:
            continue
        param = f"tools.{i}.function.parameters"
        why = await asyncio.to_thread(schema_problem, compact(parameters), param)
        if why is not None:
            raise BadRequest(why, code="invalid_json_schema", param=param)
    fmt = body.response_format
    if body.tool_mode == "forced" and fmt is not None and fmt.type != "text":
        raise BadRequest(
            "a forced tool_choice and a JSON response_format cannot be asked together",
            code="invalid_tool_choice",
            param="tool_choice",
        )


def tool_grammar(body: ChatCompletionRequest) -> dict[str, str] | None:
    """The sampling field ``grammar`` of a forced tool_choice, or None (the model writes freely)."""
    if body.tool_mode != "forced":
        return None
    tools = list(body.tools or ())
    choice = body.tool_choice
    if isinstance(choice, NamedToolChoice):
        tools = [t for t in tools if t.function.name == choice.function.name]
    defs: dict[str, Any] = {}
    calls = [_call_object(i, tool, defs) for i, tool in enumerate(tools)]
    one = calls[0] if len(calls) == 1 else {"anyOf": calls}
    many = body.parallel_calls and not isinstance(choice, NamedToolChoice)
    schema: dict[str, Any] = {"type": "array", "items": one, "minItems": 1} if many else dict(one)
    if defs:
        schema["$defs"] = defs
    return {"kind": "json_schema", "schema": compact(schema)}


def _call_object(index: int, tool: FunctionTool, defs: dict[str, Any]) -> dict[str, Any]:
    """The call object of one tool; its parameters (and their definitions) are put into ``defs``."""
    key = f"tool{index}"
    parameters = dict(tool.function.parameters or ANY_OBJECT)
    for def_key in _DEF_KEYS:
        for name, sub in (parameters.pop(def_key, None) or {}).items():
            defs[f"{key}.{name}"] = _closed(_moved_refs(sub, key))
    defs[key] = _closed(_moved_refs(parameters, key))
    return {
        "type": "object",
        "properties": {"name": {"const": tool.function.name}, "arguments": {"$ref": f"#/$defs/{key}"}},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _moved_refs(node: Any, key: str) -> Any:
    """``node`` with its local references pointing where its schema now lives."""
    if isinstance(node, list):
        return [_moved_refs(v, key) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for name, value in node.items():
        if name == "$ref" and isinstance(value, str):
            out[name] = _moved_ref(value, key)
        elif name in _DATA_KEYS:
            out[name] = value  # data, not schemas
        else:
            out[name] = _moved_refs(value, key)
    return out


def _closed(node: Any, in_all_of: bool = False) -> Any:
    """``node`` with its object schemas closed to the properties they list (not the branches of an
    ``allOf``, whose properties add up across branches)."""
    if isinstance(node, list):
        return [_closed(v, in_all_of) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DATA_KEYS:
            out[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, dict):  # names -> schemas
            out[key] = {name: _closed(sub) for name, sub in value.items()}
        else:
            out[key] = _closed(value, key == "allOf")
    open_keys = ("additionalProperties", "patternProperties", "unevaluatedProperties")
    if "properties" in out and not in_all_of and not any(k in out for k in open_keys):
        out["additionalProperties"] = False
    return out


def _moved_ref(ref: str, key: str) -> str:
    if ref == "#":
        return f"#/$defs/{key}"
    for def_key in _DEF_KEYS:
        prefix = f"#/{def_key}/"
        if ref.startswith(prefix):
            name, _, rest = ref[len(prefix) :].partition("/")
            return f"#/$defs/{key}.{name}" + (f"/{rest}" if rest else "")
    if ref.startswith("#/"):
        return f"#/$defs/{key}/{ref[2:]}"
    return ref
