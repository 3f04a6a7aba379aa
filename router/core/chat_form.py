"""Responses and Messages bodies in the chat-completions form, the one form routing reads.

Agents speak OpenAI's Responses API and Anthropic's Messages API as often as chat completions.
Each body is brought to the chat form (``messages`` and ``tools``) before
``router.core.blocks.routing_text`` canonicalises it, so one conversation keys the same
whichever door it came in by, and the precise path hands engines' chat templates the form they
take. The mapping, the same a chat client would write for the same content:

    Messages                        chat form
    system (string or text blocks)  a system message first
    text / image blocks             text / image_url content parts
    tool_use blocks                 the assistant message's tool_calls (input as compact JSON)
    tool_result blocks              tool messages (tool_call_id), before the user's other parts
    tools {name, input_schema}      {"type": "function", "function": {name, parameters}}

    Responses                       chat form
    instructions                    a system message first
    input string                    one user message
    message items                   messages (input_text / output_text -> text parts,
                                    input_image -> image_url parts)
    function_call items             tool_calls of the assistant message before them (or a new one)
    function_call_output items      tool messages
    tools {type: function, name}    {"type": "function", "function": {name, parameters}}

Anything else (thinking and reasoning, files, built-in tool calls, item references) keeps its
own type and is routed on a digest of its canonical JSON, as unknown chat content parts are:
stable from turn to turn, so the conversation's later turns still share its prefix. Every
mistyped field is a ``RequestShapeError`` naming it in the API's own terms. Bodies are read
as JSON parses them (objects are dicts).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from router.core.blocks import RequestShapeError, canonical_json

# The fields the namespace reads, carried into the chat form.
_NAMESPACE_FIELDS = ("model", "lora_adapter", "lora_path")


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise RequestShapeError(f"'{where}' must be an object", where)
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise RequestShapeError(f"'{where}' must be a string", where)
    return value


def _array(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise RequestShapeError(f"'{where}' must be an array", where)
    return value


def _head(body: Mapping[str, Any]) -> dict[str, Any]:
    return {k: body[k] for k in _NAMESPACE_FIELDS if k in body}


def _function_tool(name: Any, description: Any, parameters: Any, where: str) -> dict[str, Any]:
    function: dict[str, Any] = {"name": _string(name, f"{where}.name")}
    if description is not None:
        function["description"] = description
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


# -- Anthropic Messages ------------------------------------------------------------------------


def _anthropic_image(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    source = _object(block.get("source"), f"{where}.source")
    if source.get("type") == "base64":
        media = _string(source.get("media_type"), f"{where}.source.media_type")
        data = _string(source.get("data"), f"{where}.source.data")
        url = f"data:{media};base64,{data}"
    elif source.get("type") == "url":
        url = _string(source.get("url"), f"{where}.source.url")
    else:
        return dict(block)  # a file id or a future source: routed on its digest
    return {"type": "image_url", "image_url": {"url": url}}


def _anthropic_part(block: Any, where: str) -> Any:
    if isinstance(block, str):
        return block
    block = _object(block, where)
    kind = block.get("type")
    if kind == "text":
        return _string(block.get("text"), f"{where}.text")
    if kind == "image":
        return _anthropic_image(block, where)
    if not isinstance(kind, str):
        raise RequestShapeError(f"'{where}.type' must be a string", f"{where}.type")
    # thinking, documents, search results...: the whole block (cache_control and all), whose
    # digest is as stable as the block.
    return dict(block)


def _joined(parts: list[Any]) -> Any:
    """Text parts alone as one string, joined as chat content parts are (and as vLLM renders
    them): the same routing text, built once."""
    if all(isinstance(p, str) for p in parts):
        return "\n".join(parts)
    return [{"type": "text", "text": p} if isinstance(p, str) else p for p in parts]


def _anthropic_content(content: Any, where: str) -> Any:
    if isinstance(content, str) or content is None:
        return content
    return _joined(
        [_anthropic_part(b, f"{where}[{j}]") for j, b in enumerate(_array(content, where))]
    )


def _anthropic_message(msg: Any, where: str) -> list[dict[str, Any]]:
    msg = _object(msg, where)
    role = _string(msg.get("role"), f"{where}.role")
    content = msg.get("content")
    if not isinstance(content, list):
        return [{"role": role, "content": _anthropic_content(content, f"{where}.content")}]
    out: list[dict[str, Any]] = []
    parts: list[Any] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_use":
            args = canonical_json(block.get("input", {}), f"{at}.input")
            function = {"name": _string(block.get("name"), f"{at}.name"), "arguments": args}
            call_id = _string(block.get("id"), f"{at}.id")
            calls.append({"id": call_id, "type": "function", "function": function})
        elif kind == "tool_result":
            call_id = _string(block.get("tool_use_id"), f"{at}.tool_use_id")
            result = _anthropic_content(block.get("content"), f"{at}.content")
            out.append({"role": "tool", "tool_call_id": call_id, "content": result})
        else:
            parts.append(_anthropic_part(block, at))
    if parts or calls or not out:
        message: dict[str, Any] = {"role": role, "content": _joined(parts) if parts else None}
        if calls:
            message["tool_calls"] = calls
        out.append(message)
    return out


def _anthropic_tools(tools: Any) -> list[Any]:
    out: list[Any] = []
    for i, tool in enumerate(_array(tools, "tools")):
        tool = _object(tool, f"tools[{i}]")
        if "input_schema" in tool:
            at = f"tools[{i}]"
            out.append(
                _function_tool(tool.get("name"), tool.get("description"), tool["input_schema"], at)
            )
        else:  # a server tool (web search, code execution...): as it is
            out.append(dict(tool))
    return out


def from_messages(body: Mapping[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages body in the chat form; raises ``RequestShapeError``."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestShapeError("'messages' must be a non-empty array", "messages")
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None and system != "" and system != []:
        out.append({"role": "system", "content": _anthropic_content(system, "system")})
    for i, msg in enumerate(messages):
        out.extend(_anthropic_message(msg, f"messages[{i}]"))
    chat = _head(body)
    chat["messages"] = out
    if body.get("tools"):
        chat["tools"] = _anthropic_tools(body["tools"])
    return chat


# -- OpenAI Responses --------------------------------------------------------------------------


def _responses_part(part: Any, where: str) -> Any:
    if isinstance(part, str):
        return part
    part = _object(part, where)
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text"):
        return _string(part.get("text"), f"{where}.text")
    if kind == "input_image" and isinstance(part.get("image_url"), str):
        return {"type": "image_url", "image_url": {"url": part["image_url"]}}
    if not isinstance(kind, str):
        raise RequestShapeError(f"'{where}.type' must be a string", f"{where}.type")
    return dict(part)  # files, refusals, images by file id: routed on their digest


def _responses_content(content: Any, where: str) -> Any:
    if isinstance(content, str) or content is None:
        return content
    return _joined(
        [_responses_part(p, f"{where}[{j}]") for j, p in enumerate(_array(content, where))]
    )


def _call(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    function = {
        "name": _string(item.get("name"), f"{where}.name"),
        "arguments": _string(item.get("arguments"), f"{where}.arguments"),
    }
    call_id = _string(item.get("call_id"), f"{where}.call_id")
    return {"id": call_id, "type": "function", "function": function}


def _responses_items(items: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        item = _object(item, where)
        kind = item.get("type", "message")
        if kind == "message":
            role = _string(item.get("role"), f"{where}.role")
            content = _responses_content(item.get("content"), f"{where}.content")
            out.append({"role": role, "content": content})
        elif kind == "function_call":
            last = out[-1] if out else None
            # One assistant turn is one chat message, however many calls it made.
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": None}
                out.append(last)
            last.setdefault("tool_calls", []).append(_call(item, where))
        elif kind == "function_call_output":
            call_id = _string(item.get("call_id"), f"{where}.call_id")
            output = _responses_content(item.get("output"), f"{where}.output")
            out.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif isinstance(kind, str):
            # reasoning, built-in tool calls, item references: their own turn, by digest.
            out.append({"role": kind, "content": [dict(item)]})
        else:
            raise RequestShapeError(f"'{where}.type' must be a string", f"{where}.type")
    return out


def _responses_tools(tools: Any) -> list[Any]:
    out: list[Any] = []
    for i, tool in enumerate(_array(tools, "tools")):
        tool = _object(tool, f"tools[{i}]")
        if tool.get("type") != "function":
            out.append(dict(tool))  # built-in tools (web search, file search...): as they are
            continue
        converted = _function_tool(
            tool.get("name"), tool.get("description"), tool.get("parameters"), f"tools[{i}]"
        )
        if "strict" in tool:
            converted["function"]["strict"] = tool["strict"]
        out.append(converted)
    return out


def from_responses(body: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI Responses body in the chat form; raises ``RequestShapeError``."""
    items = body.get("input")
    out: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None and instructions != "":
        out.append({"role": "system", "content": _string(instructions, "instructions")})
    if isinstance(items, str):
        out.append({"role": "user", "content": items})
    elif isinstance(items, list):
        out.extend(_responses_items(items))
    elif items is not None:
        raise RequestShapeError("'input' must be a string or an array of input items", "input")
    if not out:
        raise RequestShapeError("'input' must be a non-empty string or array", "input")
    chat = _head(body)
    chat["messages"] = out
    if body.get("tools"):
        chat["tools"] = _responses_tools(body["tools"])
    return chat
