"""Chat templates rendered as transformers renders them, without importing transformers (or torch).

A checkpoint's template is Jinja written against transformers' environment: a sandbox with
`trim_blocks` and `lstrip_blocks`, loop controls, the `{% generation %}` tag, a `tojson` that keeps
non-ASCII text, and the globals `raise_exception` and `strftime_now`. The router renders the same
text from the same template, so the prompt it admits and charges is the prompt the model sees.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.meta
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateRefused(ValueError):
    """The template raised (e.g. roles out of order): the caller's messages are at fault."""


class _GenerationBlock(Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; serving
    renders its body unchanged."""

    tags = frozenset({"generation"})

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise(message: str) -> None:
    raise TemplateRefused(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:  # fmt: skip
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


@lru_cache(maxsize=16)
def reads_variable(source: str, name: str) -> bool:
    """Whether the template reads the variable ``name`` (``tools``: it renders tool definitions)."""
    return name in jinja2.meta.find_undeclared_variables(compile_template(source).environment.parse(source))


def render_chat(
    source: str, messages: list[dict[str, Any]], special_tokens: dict[str, str], **kwargs: Any
) -> str:
    """The prompt text for `messages` (kwargs: add_generation_prompt, tools, ...)."""
    try:
        return compile_template(source).render(messages=messages, **special_tokens, **kwargs)
    except jinja2.TemplateError as exc:
        raise TemplateRefused(str(exc)) from exc
