"""OpenAI's `response_format` on the router: the body's model, and the schema checked before admission.

`{"type": "text"}` (the default) asks for nothing; `{"type": "json_object"}` for any JSON object;
`{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}` for JSON that matches the
schema. The replica enforces it by grammar-constrained decoding (replica/grammar_compiler.py), in
strict form whatever `strict` says (a non-strict answer is a strict one that could be wrong).

The router refuses a bad schema with a 400 that points into it (`param`
"response_format.json_schema.schema", a JSON pointer in the message) before any quota is taken.
It does not compile the grammar: the grammar library (xgrammar) imports torch, which no router
process loads (tests/layout). So the router checks the schema against its own metaschema with
`jsonschema` (Draft 2020-12 unless the schema's `$schema` names another) and resolves every `$ref`
inside it; what only the compiler can refuse (a pattern it cannot parse, say) comes back from the
replica as an invalid request, also a 400.
"""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import unquote

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cluster.errors import BadRequest
from replica.grammar_spec import MAX_SCHEMA_CHARS, compact

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
    for plain text. Raises BadRequest for a schema the replica could not enforce."""
    if fmt is None or fmt.type == "text":
        return None
    schema = fmt.json_schema.schema_ if fmt.json_schema is not None else None
    if fmt.type == "json_object" or schema is None:
        return {"kind": "json_object"}
    check_schema(schema)
    return {"kind": "json_schema", "schema": compact(schema)}


def check_schema(schema: dict[str, Any]) -> None:
    """Refuse (BadRequest) a schema that is too large, breaks its metaschema, or has a `$ref` that
    resolves nowhere; the message names the place by JSON pointer."""
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import Draft202012Validator, validator_for

    if len(compact(schema)) > MAX_SCHEMA_CHARS:
        raise _bad("", f"the schema is over {MAX_SCHEMA_CHARS} characters")
    try:
        validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except SchemaError as exc:
        raise _bad(_pointer(exc.path), exc.message) from None
    for where, ref in _refs(schema, ()):
        if not _resolves(schema, ref):
            raise _bad(
                _pointer(where), f"$ref {ref!r} resolves nowhere in the schema (only local refs, #/...)"
            )


def _bad(pointer: str, message: str) -> BadRequest:
    return BadRequest(f"{PARAM} at '{pointer or '/'}': {message}", code="invalid_json_schema", param=PARAM)


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
