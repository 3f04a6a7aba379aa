"""A tool-calling agent's conversation, written in each API's own shape, for replays.

Agents are the traffic that reuses prefixes most: every turn resends the whole history (a
system prompt, the tool definitions, each earlier request, answer, tool call and tool result)
and adds one more request. ``agent_bodies`` writes the same scripted conversations as chat
completions, OpenAI Responses or Anthropic Messages bodies, each the way that API's clients
send it:

- chat: a system message; assistant messages with ``tool_calls`` (arguments a JSON string);
  ``tool`` messages with the results; tools as ``{"type": "function", "function": ...}``;
- responses: ``instructions``; ``input`` items (user and assistant messages with
  ``output_text``, ``function_call`` and ``function_call_output``); tools as
  ``{"type": "function", "name", "parameters"}``;
- messages: ``system``; content blocks (``text``, ``tool_use`` with its input an object,
  ``tool_result`` in the next user message); tools with an ``input_schema``.

The answers are scripted, not the engine's, so that the three replays send the same content:
whatever an engine generates is not part of the next turn. ``agent_trace`` turns the bodies
into the simulator's requests (router.core.simulator), routed on the text each API's body
canonicalises to; the live benchmark (bench/front_doors.py) sends them to engine-sim.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from router.core.blocks import CHARS_PER_TOKEN, block_keys, routing_text
from router.core.chat_form import from_messages, from_responses
from router.core.workload import BODY_ENGINE_BLOCK_TOKENS, TraceRequest

APIS = ("chat", "responses", "messages")
# The agents' vocabulary: what a coding agent's turns talk about.
_WORDS = (
    "read", "file", "patch", "test", "build", "error", "trace", "module", "function", "return",
    "value", "branch", "commit", "diff", "search", "index", "query", "cache", "token", "prompt",
    "answer", "check", "fix", "step", "plan", "tool", "call", "result",
)  # fmt: skip
_TOOL = {
    "name": "run",
    "description": "Run a shell command in the repository and return its output.",
    "schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """How many agents, how long their conversations, and how large each part of a turn."""

    agents: int = 8
    turns: int = 10
    system_words: int = 400
    user_words: int = 24
    answer_words: int = 30
    tool_output_words: int = 120
    max_tokens: int = 16
    seed: int = 0
    model: str = "sim-model"
    seconds_between_turns: float = 1.0


@dataclass(frozen=True, slots=True)
class _Step:
    """One scripted turn: the request, the answer, its tool call and the call's result."""

    user: str
    answer: str
    call_id: str
    arguments: Mapping[str, Any]
    output: str


def _script(spec: AgentSpec, agent: int) -> tuple[str, list[_Step]]:
    rng = random.Random(spec.seed * 1_000_003 + agent)

    def words(n: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(n))

    system = f"agent {agent}: " + words(spec.system_words)
    steps = [
        _Step(
            user=words(spec.user_words),
            answer=words(spec.answer_words),
            call_id=f"call_{agent}_{t}",
            arguments={"command": words(4)},
            output=words(spec.tool_output_words),
        )
        for t in range(spec.turns)
    ]
    return system, steps


def _arguments(step: _Step) -> str:
    # The compact JSON a tool call's arguments travel as (the Messages form carries the object).
    return json.dumps(step.arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _chat(spec: AgentSpec, system: str, steps: list[_Step], turn: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for s in steps[:turn]:
        call = {"name": _TOOL["name"], "arguments": _arguments(s)}
        messages += [
            {"role": "user", "content": s.user},
            {
                "role": "assistant",
                "content": s.answer,
                "tool_calls": [{"id": s.call_id, "type": "function", "function": call}],
            },
            {"role": "tool", "tool_call_id": s.call_id, "content": s.output},
        ]
    messages.append({"role": "user", "content": steps[turn].user})
    function = {
        "name": _TOOL["name"],
        "description": _TOOL["description"],
        "parameters": _TOOL["schema"],
    }
    return {
        "model": spec.model,
        "messages": messages,
        "tools": [{"type": "function", "function": function}],
        "max_tokens": spec.max_tokens,
    }


def _responses(spec: AgentSpec, system: str, steps: list[_Step], turn: int) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for s in steps[:turn]:
        answer = [{"type": "output_text", "text": s.answer}]
        items += [
            {"role": "user", "content": s.user},
            {"type": "message", "role": "assistant", "content": answer},
            {
                "type": "function_call",
                "call_id": s.call_id,
                "name": _TOOL["name"],
                "arguments": _arguments(s),
            },
            {"type": "function_call_output", "call_id": s.call_id, "output": s.output},
        ]
    items.append({"role": "user", "content": steps[turn].user})
    tool = {
        "type": "function",
        "name": _TOOL["name"],
        "description": _TOOL["description"],
        "parameters": _TOOL["schema"],
    }
    return {
        "model": spec.model,
        "instructions": system,
        "input": items,
        "tools": [tool],
        "max_output_tokens": spec.max_tokens,
    }


def _messages(spec: AgentSpec, system: str, steps: list[_Step], turn: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []  # the last turn's tool result opens the next request
    for s in steps[:turn]:
        use = {"type": "tool_use", "id": s.call_id, "name": _TOOL["name"], "input": s.arguments}
        messages += [
            {"role": "user", "content": [*pending, {"type": "text", "text": s.user}]},
            {"role": "assistant", "content": [{"type": "text", "text": s.answer}, use]},
        ]
        pending = [{"type": "tool_result", "tool_use_id": s.call_id, "content": s.output}]
    messages.append(
        {"role": "user", "content": [*pending, {"type": "text", "text": steps[turn].user}]}
    )
    tool = {
        "name": _TOOL["name"],
        "description": _TOOL["description"],
        "input_schema": _TOOL["schema"],
    }
    return {
        "model": spec.model,
        "system": system,
        "messages": messages,
        "tools": [tool],
        "max_tokens": spec.max_tokens,
    }


_WRITERS = {"chat": _chat, "responses": _responses, "messages": _messages}
_CHAT_FORM = {"responses": from_responses, "messages": from_messages}


def agent_bodies(spec: AgentSpec, api: str) -> Iterator[tuple[float, dict[str, Any]]]:
    """(seconds from the start, body) of every turn of every agent, in ``api``'s shape; the
    agents take their turns in step, ``seconds_between_turns`` apart."""
    write = _WRITERS[api]
    scripts = [_script(spec, a) for a in range(spec.agents)]
    for turn in range(spec.turns):
        for agent, (system, steps) in enumerate(scripts):
            at = turn * spec.seconds_between_turns + agent * 1e-3
            yield at, write(spec, system, steps, turn)


def agent_trace(spec: AgentSpec, api: str) -> list[TraceRequest]:
    """The agents' turns as the simulator's requests, each routed on its API's canonical text."""
    convert = _CHAT_FORM.get(api)
    engine_chars = BODY_ENGINE_BLOCK_TOKENS * CHARS_PER_TOKEN
    out = []
    for at, body in agent_bodies(spec, api):
        chat = body if convert is None else convert(body)
        rt = routing_text(chat)
        out.append(
            TraceRequest(
                timestamp=at,
                body=chat,
                prompt_tokens=max(1, rt.approx_tokens),
                output_tokens=spec.max_tokens,
                engine_keys=block_keys(rt, engine_chars),
                engine_block_tokens=BODY_ENGINE_BLOCK_TOKENS,
            )
        )
    return out
