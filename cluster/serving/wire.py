"""What travels between routers and replicas: small, plain, picklable values."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

from replica import RequestOutput


@dataclass(frozen=True, slots=True)
class GenerateArgs:
    """One generation: token ids (the router tokenizes) and ``replica.SamplingParams`` fields."""

    request_id: str
    prompt_ids: list[int]
    sampling: dict[str, Any] = field(default_factory=dict)
    # Seconds to gather outputs after the first before yielding: non-streamed responses need no
    # per-token messages, and each message costs CPU in the replica, Serve and the router.
    coalesce_s: float = 0.0
    # Prefix caching: whose cached prompt blocks the request may use. The tenant's own unless the
    # operator put it in a cache group (tenancy YAML `cache_group`); a cache_salt narrows either.
    tenant: str | None = None
    cache_group: str | None = None
    cache_salt: str | None = None
    # The request's SLA tier under the router's dispatch policy (0 first): the engine admits waiting
    # requests by it and preempts lower tiers' work to start a higher tier's prefill.
    priority: int = 0
    # The stream channel (``stream_channel.py``): the router's address and key, and its flush
    # interval. None: the outputs stream back over the Serve call itself (``ReplicaServer.generate``).
    reply_to: str | None = None
    channel_key: str | None = None
    flush_s: float = 0.02
    # LoRA: the adapter the request runs with (None: the base model), and its directory, which the
    # replica reads the first time one of its requests names the adapter.
    adapter: str | None = None
    adapter_path: str | None = None

    def as_wire(self) -> list[Any]:
        """The fields in order, for a direct-dispatch frame (``submit_server.py``)."""
        return [getattr(self, name) for name in _FIELDS]

    @classmethod
    def from_wire(cls, values: list[Any]) -> GenerateArgs:
        """``as_wire``'s list back; a list of the wrong shape raises ``TypeError``."""
        if not isinstance(values, list) or len(values) != len(_FIELDS):
            raise TypeError("generate arguments of the wrong shape")
        return cls(*values)

    def cache_scope(self) -> str:
        """The engine's opaque cache scope. Groups and tenants are tagged apart, so a tenant named
        like some group never shares that group's blocks; no tenant (a direct caller) is one scope."""
        owner = ["group", self.cache_group] if self.cache_group is not None else ["tenant", self.tenant]
        scope = [*owner, self.cache_salt]
        # An adapter changes every key and value: its blocks are its own (and the routers' prefix
        # affinity, which hashes prompts under this scope, tells them apart too).
        return json.dumps(scope if self.adapter is None else [*scope, "adapter", self.adapter])


_FIELDS = tuple(f.name for f in fields(GenerateArgs))


def output_item(out: RequestOutput, replica_id: str, total_output_tokens: int, done: bool) -> dict[str, Any]:
    """One engine delivery as a dict: a choice's new tokens (`index`), with the request's running total
    of output tokens and whether every choice has ended (`done`); timing metrics on a choice's end.
    Logprobs travel as [token id, logprob, [[id, logprob], ...]] per token."""
    item: dict[str, Any] = {
        "request_id": out.request_id,
        "index": out.index,
        "token_ids": list(out.token_ids),
        "text": out.text,
        "finish_reason": out.finish_reason,
        "num_prompt_tokens": out.num_prompt_tokens,
        "num_output_tokens": out.num_output_tokens,
        "num_cached_tokens": out.num_cached_tokens,
        "total_output_tokens": total_output_tokens,
        "done": done,
        "replica_id": replica_id,
    }
    if out.logprobs is not None:
        item["logprobs"] = [_logprob(lp) for lp in out.logprobs]
    if out.prompt_logprobs is not None:
        item["prompt_logprobs"] = [None if lp is None else _logprob(lp) for lp in out.prompt_logprobs]
    if out.metrics is not None:  # the engine's own clock: arrival → first step, → first token
        m = out.metrics
        item["num_preemptions"] = m.num_preemptions
        item["engine_queue_s"] = None if m.first_scheduled is None else m.first_scheduled - m.arrival
        item["engine_ttft_s"] = None if m.first_token is None else m.first_token - m.arrival
    return item


class OutputTally:
    """One request's running counts over its choices: each engine output as its ``output_item``, with
    the request's total output tokens so far and ``done`` once every choice has ended."""

    def __init__(self, replica_id: str, choices: int) -> None:
        self._replica_id = replica_id
        self._counts = [0] * choices  # output tokens per choice
        self._open_choices = choices

    def item(self, out: RequestOutput) -> dict[str, Any]:
        self._counts[out.index] = out.num_output_tokens
        self._open_choices -= out.finished
        return output_item(out, self._replica_id, sum(self._counts), done=self._open_choices == 0)


def _logprob(lp) -> list:
    return [lp.token_id, lp.logprob, [list(pair) for pair in lp.top]]


ABORTED = "the replica stopped before the request finished"


def error_item(kind: str, message: str) -> dict[str, Any]:
    """An error yielded in the stream; ``kind`` is ``invalid_request``, ``engine_error`` or ``aborted``
    (the engine stopped with the request unfinished)."""
    return {"error": {"kind": kind, "message": message}}


def merge_items(first: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """Two consecutive output dicts of one choice as one (tokens, text and logprobs concatenated,
    counts from the later)."""
    merged = dict(later)
    merged["token_ids"] = first["token_ids"] + later["token_ids"]
    merged["text"] = first["text"] + later["text"]
    if "logprobs" in first or "logprobs" in later:
        merged["logprobs"] = first.get("logprobs", []) + later.get("logprobs", [])
    if "prompt_logprobs" in first:
        merged["prompt_logprobs"] = first["prompt_logprobs"]
    return merged
