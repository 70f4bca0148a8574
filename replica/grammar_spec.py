"""What a request's output must match: a JSON schema, or any JSON object (OpenAI's `response_format`).

Plain data, no grammar library and no torch: the router builds it from the request body and it
travels to the replica inside the sampling fields; the replica compiles it once per distinct spec
(`replica/grammar_compiler.py`, an LRU keyed by this value). The schema is kept as compact JSON text
(no spaces), so two requests with the same schema share one compiled grammar however they spaced
it. Key order is kept: a grammar writes an object's properties in the order the schema lists them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from replica.errors import InvalidRequestError

KINDS = ("json_object", "json_schema")
MAX_SCHEMA_CHARS = 64 * 1024  # a schema larger than this is refused before any compile
# OpenAI's json_object mode: any JSON object at the top level.
OBJECT_SCHEMA = '{"type":"object"}'


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    kind: str  # "json_object" | "json_schema"
    schema: str  # compact JSON text of the schema ("json_object": OBJECT_SCHEMA)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidRequestError(f"grammar kind must be one of {KINDS}, got {self.kind!r}")
        if len(self.schema) > MAX_SCHEMA_CHARS:
            raise InvalidRequestError(f"the JSON schema is over {MAX_SCHEMA_CHARS} characters")

    @property
    def schema_dict(self) -> dict[str, Any]:
        return json.loads(self.schema)

    def as_fields(self) -> dict[str, str]:
        """The wire form (a plain dict inside the sampling fields)."""
        return {"kind": self.kind, "schema": self.schema}


def compact(schema: Any) -> str:
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def json_schema(schema: dict[str, Any] | bool) -> GrammarSpec:
    if not isinstance(schema, dict | bool):
        raise InvalidRequestError("a JSON schema is an object (or true/false)")
    return GrammarSpec("json_schema", compact(schema))


def json_object() -> GrammarSpec:
    return GrammarSpec("json_object", OBJECT_SCHEMA)


def grammar_spec(value: Any) -> GrammarSpec | None:
    """A spec from what SamplingParams is given: None, a GrammarSpec, or its wire dict
    ({"kind": ..., "schema": <JSON text or object>})."""
    if value is None or isinstance(value, GrammarSpec):
        return value
    if not isinstance(value, dict) or set(value) - {"kind", "schema"}:
        raise InvalidRequestError(f"grammar must be a GrammarSpec or {{'kind', 'schema'}}, got {value!r}")
    kind = value.get("kind")
    if kind == "json_object":
        return json_object()
    schema = value.get("schema")
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise InvalidRequestError(f"the JSON schema does not parse: {exc}") from None
    if kind != "json_schema":
        raise InvalidRequestError(f"grammar kind must be one of {KINDS}, got {kind!r}")
    return json_schema(schema)
