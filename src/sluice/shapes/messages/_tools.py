"""Anthropic ``tools`` and ``tool_choice`` -> Chat Completions ``tools``, ``tool_choice``
and ``parallel_tool_calls`` (the decisions: :mod:`._in`)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._fields import compact_json, obj, refuse, seq, shown, text

__all__ = ["OPENAI_NAME_LIMIT", "ChatTools", "chat_tool_choice", "chat_tools", "forces_a_tool"]

#: tool_param.py / the API's 400s: a custom tool's name.
_NAME = re.compile(r"[a-zA-Z0-9_-]{1,128}")
#: Chat Completions' function names stop at 64 characters (^[a-zA-Z0-9_-]{1,64}$).
OPENAI_NAME_LIMIT = 64
_CHOICES = ("auto", "any", "tool", "none")


@dataclass(frozen=True, slots=True)
class ChatTools:
    """The function tools, and the name of every tool (server tools too, for tool_choice)."""

    functions: list[dict[str, Any]]
    names: frozenset[str]


def chat_tools(value: Any, lost: list[str]) -> ChatTools:
    functions: list[dict[str, Any]] = []
    names: set[str] = set()
    for number, item in enumerate(seq(value, "tools")):
        where = f"tools[{number}]"
        tool = obj(item, where)
        name = text(tool.get("name"), f"{where}.name", empty=False)
        kind = tool.get("type")
        if kind in (None, "custom"):
            functions.append(_function(tool, name, where, lost))
        elif isinstance(kind, str):
            # web_search, web_fetch, code_execution, tool_search and mcp run on Anthropic's side;
            # bash, text_editor, computer and memory are run by the client but defined by
            # Anthropic (Claude is trained on their schemas, which the request does not carry)
            lost.append(f"{where}: {kind!r} is a tool Anthropic defines; a chat deployment has no such tool")
        else:
            refuse(f"{where}.type", f"must be a string naming the tool's type, got {shown(kind)}")
        if name in names:
            refuse(f"{where}.name", f"tool names must be unique, {name!r} is used twice")
        names.add(name)
    return ChatTools(functions, frozenset(names))


def _function(tool: Mapping[str, Any], name: str, where: str, lost: list[str]) -> dict[str, Any]:
    """A custom tool as a function tool. ``cache_control``, ``strict`` (the schema still
    shapes the call, without the guarantee), ``input_examples``, ``defer_loading`` and
    ``eager_input_streaming`` are dropped: hints about the call, not what it is."""
    if not _NAME.fullmatch(name):
        refuse(f"{where}.name", f"must match ^[a-zA-Z0-9_-]{{1,128}}$, got {shown(name)}")
    if len(name) > OPENAI_NAME_LIMIT:
        lost.append(f"{where}.name: {name!r} is longer than the {OPENAI_NAME_LIMIT} characters Chat Completions takes")
    schema = obj(tool.get("input_schema"), f"{where}.input_schema")
    if schema.get("type") != "object":
        refuse(f"{where}.input_schema.type", f"must be 'object', got {shown(schema.get('type'))}")
    function: dict[str, Any] = {"name": name}
    description = tool.get("description")
    if description is not None:
        function["description"] = text(description, f"{where}.description")
    function["parameters"] = json.loads(compact_json(schema, f"{where}.input_schema"))
    callers = tool.get("allowed_callers")
    if callers is not None and "direct" not in seq(callers, f"{where}.allowed_callers"):
        lost.append(f"{where}.allowed_callers: the tool may only be called from Anthropic's code execution tool")
    return {"type": "function", "function": function}


def chat_tool_choice(value: Any, tools: ChatTools) -> dict[str, Any]:
    """The chat parameters for Anthropic's ``tool_choice``: auto/any/tool/none ->
    "auto"/"required"/a named function/"none", ``disable_parallel_tool_use`` ->
    ``parallel_tool_calls: false``. Nothing when there are no function tools to choose from."""
    choice = obj(value, "tool_choice")
    kind = choice.get("type")
    if kind not in _CHOICES:
        refuse("tool_choice.type", f"must be one of {', '.join(map(repr, _CHOICES))}, got {shown(kind)}")
    single = choice.get("disable_parallel_tool_use")
    if single is not None and not isinstance(single, bool):
        refuse("tool_choice.disable_parallel_tool_use", f"must be a boolean, got {shown(single)}")
    if kind in ("any", "tool") and not tools.names:
        refuse("tool_choice", f"tool_choice {kind!r} may only be specified while providing tools")
    out: dict[str, Any] = {}
    if kind == "tool":
        name = text(choice.get("name"), "tool_choice.name", empty=False)
        if name not in tools.names:
            refuse("tool_choice.name", f"there is no tool named {name!r} in tools")
        if all(tool["function"]["name"] != name for tool in tools.functions):
            return {}  # a server tool, lost already: nothing a chat deployment could be told
        out["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    if single and kind != "none":
        out["parallel_tool_calls"] = False
    return out if tools.functions else {}


def forces_a_tool(value: Any) -> bool:
    return isinstance(value, Mapping) and value.get("type") in ("any", "tool")
