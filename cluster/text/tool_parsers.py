"""Reading tool calls out of a model's answer, one parser per model family, as the text streams.

* ``hermes`` (Hermes 2/3, Qwen 2.5/3 and the system-prompt fallback of ``tool_prompt.py``): each call
  is a JSON object inside ``<tool_call>...</tool_call>``; text outside the tags is content.
* ``llama3_json`` (Llama 3.1/3.2/3.3): an answer that starts with ``{`` (or ``<|python_tag|>``) is
  calls, ``{"name": ..., "parameters": {...}}``, separated by ``;``; any other answer is content.
* ``forced`` (``tool_choice`` "required" or a named function): the grammar made the whole answer one
  call object, or an array of them.

Each parser is fed the answer's text in pieces and gives events (``tool_call_scanner``): content,
and call pieces. A collected answer is the same parser fed once, so a stream and a collected answer
of the same text say the same. Trailing whitespace of the content is held until more text comes: it
is dropped when the answer made calls (the newlines around the tags), kept when it made none.
"""

from __future__ import annotations

from typing import Literal, Protocol

from cluster.text.tool_call_scanner import CallDelta, CallScanner, Content, Event

Family = Literal["hermes", "llama3_json"]
FAMILIES: tuple[Family, ...] = ("hermes", "llama3_json")
PYTHON_TAG = "<|python_tag|>"


class ToolParser(Protocol):
    calls: int

    def feed(self, text: str) -> list[Event]: ...

    def finish(self) -> list[Event]: ...


class _ContentGate:
    """Passes content on, holding back trailing whitespace until more text comes (so where the
    pieces fall never changes what is said)."""

    def __init__(self) -> None:
        self._held = ""

    def take(self, events: list[Event]) -> list[Event]:
        out: list[Event] = []
        for event in events:
            if isinstance(event, CallDelta):
                out.append(event)
                continue
            text = self._held + event.text
            ready = text.rstrip()
            self._held = text[len(ready) :]
            if ready:
                out.append(Content(ready))
        return out

    def finish(self, made_calls: bool) -> list[Event]:
        held, self._held = self._held, ""
        return [Content(held)] if held and not made_calls else []


def _partial_tail(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` could be the start of ``tag``."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


class HermesParser:
    START, END = "<tool_call>", "</tool_call>"

    def __init__(self) -> None:
        self._scanner = CallScanner()
        self._gate = _ContentGate()
        self._pending = ""
        self._inside = False

    @property
    def calls(self) -> int:
        return self._scanner.calls

    def feed(self, text: str) -> list[Event]:
        self._pending += text
        out: list[Event] = []
        while True:
            tag = self.END if self._inside else self.START
            at = self._pending.find(tag)
            if at < 0:
                keep = _partial_tail(self._pending, tag)
                ready = self._pending[: len(self._pending) - keep]
                self._pending = self._pending[len(ready) :]
                out += self._take(ready)
                return self._gate.take(out)
            out += self._take(self._pending[:at])
            self._pending = self._pending[at + len(tag) :]
            if self._inside:
                out += self._scanner.end_block()
            self._inside = not self._inside

    def finish(self) -> list[Event]:
        out = self._take(self._pending)
        self._pending = ""
        if self._inside:
            out += self._scanner.end_block()
        return self._gate.take(out) + self._gate.finish(self.calls > 0)

    def _take(self, text: str) -> list[Event]:
        if not text:
            return []
        return self._scanner.feed(text) if self._inside else [Content(text)]


class Llama3JsonParser:
    def __init__(self) -> None:
        self._scanner = CallScanner()
        self._gate = _ContentGate()
        self._head = ""
        self._mode: Literal["calls", "text"] | None = None

    @property
    def calls(self) -> int:
        return self._scanner.calls

    def feed(self, text: str) -> list[Event]:
        if self._mode is None:
            self._head += text
            start = self._head.lstrip()
            if not start or (PYTHON_TAG.startswith(start) and start != PYTHON_TAG):
                return []  # not decided yet
            if start.startswith(PYTHON_TAG):
                self._mode, text = "calls", start[len(PYTHON_TAG) :]
            else:
                self._mode, text = ("calls" if start[0] == "{" else "text"), self._head
            self._head = ""
        if self._mode == "text":
            return self._gate.take([Content(text)])
        return self._gate.take(self._scanner.feed(text))

    def finish(self) -> list[Event]:
        out: list[Event] = []
        if self._mode is None and self._head:
            out.append(Content(self._head))
        elif self._mode == "calls":
            out += self._scanner.end_block()
        return self._gate.take(out) + self._gate.finish(self.calls > 0)


class ForcedParser:
    """The answer of a forced tool_choice: call objects only (the grammar saw to it)."""

    def __init__(self) -> None:
        self._scanner = CallScanner()

    @property
    def calls(self) -> int:
        return self._scanner.calls

    def feed(self, text: str) -> list[Event]:
        return self._scanner.feed(text)

    def finish(self) -> list[Event]:
        return self._scanner.end_block()


def new_parser(family: Family | Literal["forced"]) -> ToolParser:
    if family == "forced":
        return ForcedParser()
    return HermesParser() if family == "hermes" else Llama3JsonParser()


def parse_all(parser: ToolParser, text: str) -> tuple[str, list[dict[str, str]]]:
    """A whole answer: its content and its calls, ``{"id", "name", "arguments"}`` each."""
    content, calls = [], {}
    for event in parser.feed(text) + parser.finish():
        if isinstance(event, Content):
            content.append(event.text)
            continue
        call = calls.setdefault(event.index, {"id": "", "name": "", "arguments": ""})
        call["id"] = event.id or call["id"]
        call["name"] = event.name or call["name"]
        call["arguments"] += event.arguments
    return "".join(content), [calls[i] for i in sorted(calls)]
