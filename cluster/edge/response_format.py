"""OpenAI's `response_format` on the router: the body's model, and the schema checked before admission.

`{"type": "text"}` (the default) asks for nothing; `{"type": "json_object"}` for any JSON object;
`{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}` for JSON that matches the
schema. The replica enforces it by grammar-constrained decoding (replica/grammar_compiler.py), in
strict form whatever `strict` says (a non-strict answer is a strict one that could be wrong).

The router refuses a bad schema with a 400 (`param` "response_format.json_schema.schema") before any
quota is taken, in two checks: `jsonschema` against the schema's metaschema (Draft 2020-12 unless its
`$schema` names another) with every `$ref` resolved inside it, whose message gives a JSON pointer
into the schema; then the grammar library itself (llguidance) builds the grammar without a
tokenizer, which refuses what it cannot enforce. The library is used here only because it imports
no torch (no router process loads torch: tests/layout); were it ever to, the router would skip that
check (it looks at sys.modules) and the replica's compile error would still come back as a 400.
Both checks are cached per schema text.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from functools import lru_cache
from typing import Any, Literal
from urllib.parse import unquote

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cluster.errors import BadRequest
from replica.grammar_compiler import JSON_OPTIONS
from replica.grammar_spec import MAX_SCHEMA_CHARS, compact

log = logging.getLogger(__name__)
PARAM = "response_format.json_schema.schema"
DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})  # values there are data, not schemas


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(max_length=64, pattern=r"^[a-zA-Z0-9_-]+$", description="The format's name.")
    description: str | None = Field(default=None, description="What the format is for (informational).")
    schema_: dict[str, Any] | None = Field(
        default=None,
        alias="schema",
        description="The JSON Schema the answer matches (any object if left out).",
    )
    strict: bool | None = Field(default=None, description="Accepted; the answer always matches the schema.")


class ResponseFormat(BaseModel):
    """What the answer must be: plain text, any JSON object, or JSON matching a schema."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError('json_schema is given with type "json_schema", and only then')
        return self


def grammar_fields(fmt: ResponseFormat | None) -> dict[str, str] | None:
    """The `grammar` sampling field (replica.grammar_spec's wire form) of a response format, or None
    for plain text. Not checked yet: `check_grammar` does that, off the event loop."""
    if fmt is None or fmt.type == "text":
        return None
    schema = fmt.json_schema.schema_ if fmt.json_schema is not None else None
    if fmt.type == "json_object" or schema is None:
        return {"kind": "json_object"}
    return {"kind": "json_schema", "schema": compact(schema)}


async def check_grammar(fields: dict[str, str] | None) -> None:
    """Raise BadRequest for a schema the replica could not enforce. The checks run on a worker thread
    (a large schema takes milliseconds), so the router's event loop never waits on them."""
    if fields is None or fields["kind"] != "json_schema":
        return
    problem = await asyncio.to_thread(schema_problem, fields["schema"])
    if problem is not None:
        raise BadRequest(problem, code="invalid_json_schema", param=PARAM)


@lru_cache(maxsize=256)
def schema_problem(text: str, param: str = PARAM) -> str | None:
    """Why the schema (compact JSON text) cannot be enforced, or None; cached per schema. The message
    starts with ``param`` (where the schema sits in the request: tools' parameters check here too)."""
    if len(text) > MAX_SCHEMA_CHARS:
        return _at("", f"the schema is over {MAX_SCHEMA_CHARS} characters", param)
    return _metaschema_problem(json.loads(text), param) or _library_problem(text, param)


def _metaschema_problem(schema: dict[str, Any], param: str) -> str | None:
    """The schema against its metaschema, and every `$ref` resolved; the message points into it."""
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import Draft202012Validator, validator_for

    try:
        validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except SchemaError as exc:
        return _at(_pointer(exc.path), exc.message, param)
    for where, ref in _refs(schema, ()):
        if not _resolves(schema, ref):
            why = f"$ref {ref!r} resolves nowhere in the schema (only local refs, #/...)"
            return _at(_pointer(where), why, param)
    return None


def _library_problem(text: str, param: str) -> str | None:
    """The grammar library's own verdict (no tokenizer needed), where it runs torch-free here."""
    library = _grammar_library()
    if library is None:
        return None
    try:
        grammar = library.LLMatcher.grammar_from_json_schema(text, defaults=JSON_OPTIONS)
    except ValueError as exc:
        return _at("", str(exc), param)
    is_error, messages = library.LLMatcher.validate_grammar_with_warnings(grammar)
    return _at("", f"the grammar cannot be built: {messages[0]}", param) if is_error else None


@lru_cache(maxsize=1)
def _grammar_library():
    """llguidance, if installed and torch-free; else None (the replica reports compile errors)."""
    had_torch = "torch" in sys.modules
    try:
        import llguidance
    except ImportError:
        return None
    if not had_torch and "torch" in sys.modules:
        log.warning("llguidance imported torch: the router leaves grammar checks to the replicas")
        return None
    return llguidance


def _at(pointer: str, message: str, param: str = PARAM) -> str:
    return f"{param} at '{pointer or '/'}': {message}"


def _pointer(path) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def _refs(node: Any, path: tuple) -> list[tuple[tuple, str]]:
    """(path of the `$ref` keyword, its value) for every reference in the schema."""
    found: list[tuple[tuple, str]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                found.append(((*path, key), value))
            elif key not in DATA_KEYWORDS:
                found.extend(_refs(value, (*path, key)))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found.extend(_refs(value, (*path, i)))
    return found


def _resolves(root: dict[str, Any], ref: str) -> bool:
    """A local JSON-pointer reference ("#" or "#/a/b") that names a schema inside `root`."""
    if ref == "#":
        return True
    if not ref.startswith("#/"):
        return False
    node: Any = root
    for raw in ref[2:].split("/"):
        key = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return False
    return isinstance(node, dict | bool)
