"""Tool calls written as JSON objects, read as the text arrives: ``{"name": ..., "arguments": {...}}``.

A model (or the grammar of a forced ``tool_choice``) writes each call as one JSON object holding the
function's name and its arguments (``parameters`` in Llama 3.1's format); several calls may follow one
another, separated by whitespace, ``,`` or ``;``, or sit in a JSON array. The scanner turns that text
into events as it grows, so a stream can say the call's id and name as soon as they are written and
then pass the arguments on piece by piece, as OpenAI streams them.

When the object starts ``{"name": "<name>", "arguments": {`` the arguments are streamed as raw text
(what the model wrote, so the streamed pieces and the collected answer are the same string). An object
in any other shape (arguments first, arguments as a string) is held until it is complete and then read
whole; one that is no call at all (no string ``name``) comes back as content. Text that does not start
an object ends the scanning: it and everything after it is content.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass

_HEADER = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')
_BETWEEN = " \t\r\n,;[]"  # what may separate calls (and open or close an array of them)
_ID_CHARS = string.ascii_letters + string.digits


def call_id() -> str:
    """A call id as OpenAI writes them: ``call_`` and 24 random letters and digits."""
    return "call_" + "".join(secrets.choice(_ID_CHARS) for _ in range(24))


@dataclass(frozen=True, slots=True)
class Content:
    """Text that is the answer's content."""

    text: str


@dataclass(frozen=True, slots=True)
class CallDelta:
    """A piece of the call numbered ``index``: its first piece carries the id and name."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None


Event = Content | CallDelta


class _Balance:
    """Finds where the JSON object or array opened at ``start`` closes, resuming where it stopped."""

    def __init__(self, start: int) -> None:
        self._at = start
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._closed_at: int | None = None

    def end(self, text: str) -> int | None:
        """The index just past the closing bracket, or None while it is still open."""
        if self._closed_at is not None:
            return self._closed_at
        for i in range(self._at, len(text)):
            c = text[i]
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == '"':
                    self._in_string = False
            elif c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._closed_at = i + 1
                    return i + 1
        self._at = len(text)
        return None


class CallScanner:
    """Events from the text of a sequence of JSON call objects, fed piece by piece."""

    def __init__(self) -> None:
        self._text = ""
        self._pos = 0  # where the current object starts (or the next one is looked for)
        self._object: _Balance | None = None
        self._arguments: _Balance | None = None  # the streamed arguments' own brackets
        self._streamed = False  # the current object's id and name went out already
        self._sent = 0  # end of the arguments text sent so far
        self._plain = False  # no more calls: all the rest is content
        self.calls = 0

    def feed(self, text: str) -> list[Event]:
        if self._plain:
            return [Content(text)] if text else []
        self._text += text
        out: list[Event] = []
        while not self._plain:
            if self._object is None and not self._open_next(out):
                break
            end = self._object.end(self._text)  # type: ignore[union-attr]
            if not self._streamed:
                self._try_header(out)
            if self._streamed:
                self._send_arguments(out)
            if end is None:
                break
            self._close(end, out)
        return out

    def end_block(self) -> list[Event]:
        """The text stops here (a closing tag, or the end of the output): an object still open that
        was not streamed is content (a call cut short); one being streamed stays as it was sent."""
        out: list[Event] = []
        if self._object is not None and not self._streamed:
            out.append(Content(self._text[self._pos :]))
        elif self._streamed:
            self.calls += 1  # cut short, but its id and name went out: the next call is the next index
        self._text, self._pos, self._object, self._streamed, self._plain = "", 0, None, False, False
        return out

    def _open_next(self, out: list[Event]) -> bool:
        while self._pos < len(self._text) and self._text[self._pos] in _BETWEEN:
            self._pos += 1
        if self._pos >= len(self._text):
            return False
        if self._text[self._pos] != "{":
            self._plain = True
            out.append(Content(self._text[self._pos :]))
            return False
        self._object = _Balance(self._pos)
        return True

    def _try_header(self, out: list[Event]) -> None:
        match = _HEADER.match(self._text, self._pos)
        if match is None or match.end() >= len(self._text) or self._text[match.end()] != "{":
            return
        name = json.loads(f'"{match.group(1)}"')
        out.append(CallDelta(self.calls, id=call_id(), name=name))
        self._streamed = True
        self._arguments = _Balance(match.end())
        self._sent = match.end()

    def _send_arguments(self, out: list[Event]) -> None:
        assert self._arguments is not None
        end = self._arguments.end(self._text)
        upto = end if end is not None else len(self._text)
        if upto > self._sent:
            out.append(CallDelta(self.calls, arguments=self._text[self._sent : upto]))
            self._sent = upto

    def _close(self, end: int, out: list[Event]) -> None:
        """The object ends at ``end``: a streamed call is done; any other is read whole now."""
        if self._streamed:
            self.calls += 1
        else:
            raw = self._text[self._pos : end]
            call = _whole_call(raw)
            if call is None:
                out.append(Content(raw))
            else:
                out.append(CallDelta(self.calls, arguments=call[1], id=call_id(), name=call[0]))
                self.calls += 1
        self._pos, self._object, self._arguments, self._streamed = end, None, None, False


def _whole_call(raw: str) -> tuple[str, str] | None:
    """(name, arguments as JSON text) of a complete call object, or None if it is no call."""
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        return value["name"], arguments
    if not isinstance(arguments, dict):
        return None
    return value["name"], json.dumps(arguments, ensure_ascii=False)
