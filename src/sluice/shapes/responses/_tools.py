"""A Responses body's ``tools``, ``tool_choice`` and ``text`` in Chat Completions' words.

- Function tools (``{type: "function", name, description, parameters, strict}``, flat)
  become ``{type: "function", function: {...}}``. ``strict`` is passed only when given:
  left out, Responses tries to make the schema strict and falls back to best effort,
  and Chat Completions' default is that best effort. ``output_schema`` is dropped (it
  describes what the caller's function returns, not the answer). ``defer_loading``,
  ``async`` and a ``programmatic`` caller are lost (tool search and programs run at
  OpenAI).
- A ``namespace`` tool (a group of the client's own function tools, as OpenAI's Codex
  CLI sends on every request) is flattened into its functions: function ``f`` of
  namespace ``ns`` is the chat function ``ns__f`` (past 64 characters, cut and ended
  with a hash of both names), its description after the namespace's. The answer names
  the call as the client does (``name: "f", namespace: "ns"``: :func:`namespaced`), and
  a ``function_call`` item with a ``namespace`` goes back as ``ns__f``. A flattened name
  that is another tool's is refused. A custom tool in a namespace is lost.
- Every other tool (web search, file search, computer use, code interpreter, MCP, image
  generation, shells, patches, custom tools, tool search...) is lost: a chat deployment
  cannot run OpenAI's tools, and cannot answer with a custom tool call.
- ``tool_choice``: ``none``/``auto``/``required`` as they are, ``{type: function, name}``
  as ``{type: function, function: {name}}``, ``allowed_tools`` as Chat Completions'
  ``allowed_tools``; a choice of a built-in tool is lost. ``tool_choice`` and
  ``parallel_tool_calls`` are only sent with tools (OpenAI's Chat Completions refuses
  them alone).
- ``text.format``: ``json_schema`` -> ``response_format`` ``json_schema`` (name, schema,
  strict, description), ``json_object`` -> ``json_object`` (refused, as OpenAI refuses
  it, when no message says "json"), ``text`` -> nothing; ``text.verbosity`` ->
  ``verbosity``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from .._common import ShapeError
from ._fields import (
    at,
    invalid_value,
    missing,
    read_array,
    read_bool,
    read_enum,
    read_object,
    read_str,
    wrong_type,
)

__all__ = ["BUILTIN_TOOLS", "chat_text_format", "chat_tool_choice", "chat_tools", "flat_name", "namespaced"]

#: Tools OpenAI runs itself, or that answer in shapes a chat deployment has none of (tool_param.py).
BUILTIN_TOOLS = (
    "file_search",
    "computer",
    "computer_use",
    "computer_use_preview",
    "web_search",
    "web_search_2025_08_26",
    "web_search_preview",
    "web_search_preview_2025_03_11",
    "mcp",
    "code_interpreter",
    "programmatic_tool_calling",
    "image_generation",
    "local_shell",
    "shell",
    "custom",
    "tool_search",
    "apply_patch",
)
_TOOL_TYPES = ("function", "namespace", *BUILTIN_TOOLS)
_NAME = re.compile(r"[a-zA-Z0-9_-]+")
_NAME_PATTERN = "^[a-zA-Z0-9_-]+$"


def _name(obj: Mapping[str, Any], path: str) -> str:
    """A function's or a schema's name, as OpenAI checks it (1-64 of ``a-zA-Z0-9_-``)."""
    name = read_str(obj, "name", path, required=True, nonempty=True, max_length=64)
    assert name is not None
    if not _NAME.fullmatch(name):
        where = at(path, "name")
        raise ShapeError(
            f"Invalid '{where}': string does not match pattern. Expected a string that matches the pattern "
            f"'{_NAME_PATTERN}'.",
            where,
            "invalid_value",
        )
    return name


def flat_name(namespace: str, name: str) -> str:
    """The chat function name of function ``name`` in ``namespace``: ``namespace__name``,
    or, past the 64 characters a function name may have, its first 55 and a hash of both."""
    joined = f"{namespace}__{name}"
    if len(joined) <= 64:
        return joined
    digest = hashlib.sha256(f"{namespace}\x00{name}".encode()).hexdigest()[:8]
    return f"{joined[:55]}_{digest}"


def namespaced(body: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """Chat function name -> (namespace, name) for every function of the body's
    ``namespace`` tools: how an answer's calls are named back as the client named them."""
    names: dict[str, tuple[str, str]] = {}
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, Mapping) or tool.get("type") != "namespace":
            continue
        group, inner = tool.get("name"), tool.get("tools")
        if not isinstance(group, str) or not isinstance(inner, list):
            continue
        for function in inner:
            if isinstance(function, Mapping) and function.get("type") == "function":
                name = function.get("name")
                if isinstance(name, str):
                    names[flat_name(group, name)] = (group, name)
    return names


def chat_tools(body: Mapping[str, Any], lost: list[str]) -> list[dict[str, Any]]:
    tools = read_array(body, "tools") or []
    chat: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        path = at("tools", i)
        if not isinstance(tool, Mapping):
            raise wrong_type(path, "an object", tool)
        type_ = tool.get("type")
        if type_ is None:
            raise missing(at(path, "type"))
        if type_ == "namespace":
            chat.extend(_namespace(tool, path, lost))
        elif type_ == "function":
            chat.append(_function(tool, path, lost))
        elif not isinstance(type_, str) or type_ not in BUILTIN_TOOLS:
            raise invalid_value(at(path, "type"), type_, _TOOL_TYPES)
        else:
            lost.append(f"{path}: the {type_} tool (a tool OpenAI runs itself)")
    seen: set[str] = set()
    for tool in chat:
        name = tool["function"]["name"]
        if name in seen:
            raise ShapeError(
                f"Invalid 'tools': the function name {name!r} is given twice (a namespace's functions are "
                "sent as namespace__name).",
                "tools",
                "invalid_value",
            )
        seen.add(name)
    return chat


def _namespace(tool: Mapping[str, Any], path: str, lost: list[str]) -> list[dict[str, Any]]:
    """A namespace tool's functions as flat chat functions (see the module docstring)."""
    group = _name(tool, path)
    about = read_str(tool, "description", path, required=True)
    inner = read_array(tool, "tools", path)
    if inner is None:
        raise missing(at(path, "tools"))
    functions = []
    for j, member in enumerate(inner):
        where = at(at(path, "tools"), j)
        if not isinstance(member, Mapping):
            raise wrong_type(where, "an object", member)
        kind = member.get("type")
        if kind == "custom":
            lost.append(f"{where}: a custom tool (a chat deployment cannot answer with a custom tool call)")
            continue
        if kind != "function":
            raise invalid_value(at(where, "type"), kind, ("function", "custom"))
        function = _function(member, where, lost)["function"]
        function["name"] = flat_name(group, function["name"])
        own = function.get("description")
        function["description"] = f"{about}\n\n{own}" if own and about else own or about or ""
        functions.append({"type": "function", "function": function})
    return functions


def _function(tool: Mapping[str, Any], path: str, lost: list[str]) -> dict[str, Any]:
    """A flat Responses function tool as a Chat Completions one."""
    function: dict[str, Any] = {"name": _name(tool, path)}
    description = read_str(tool, "description", path)
    if description is not None:
        function["description"] = description
    parameters = read_object(tool, "parameters", path)
    if parameters is not None:
        function["parameters"] = dict(parameters)
    strict = read_bool(tool, "strict", path)
    if strict is not None:
        function["strict"] = strict
    read_object(tool, "output_schema", path)  # dropped: what the function returns
    if read_bool(tool, "defer_loading", path):
        lost.append(f"{path}.defer_loading (tools loaded by OpenAI's tool search)")
    if read_bool(tool, "async", path):
        lost.append(f"{path}.async (a function OpenAI calls asynchronously)")
    callers = read_array(tool, "allowed_callers", path) or []
    for j, caller in enumerate(callers):
        where = at(at(path, "allowed_callers"), j)
        if caller not in ("direct", "programmatic"):
            raise invalid_value(where, caller, ("direct", "programmatic"))
        if caller == "programmatic":
            lost.append(f"{where}: a programmatic caller (programs run at OpenAI)")
    return {"type": "function", "function": function}


def chat_tool_choice(body: Mapping[str, Any], tools: list[dict[str, Any]], lost: list[str]) -> Any:
    """The Chat Completions ``tool_choice``, or None to send none."""
    choice = body.get("tool_choice")
    if choice is None:
        return None
    names = {tool["function"]["name"] for tool in tools}
    if isinstance(choice, str):
        read_enum(body, "tool_choice", "", ("none", "auto", "required"))
        if choice == "required" and not tools and not body.get("tools"):
            raise ShapeError(
                "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
                "tool_choice",
                "invalid_value",
            )
        return choice if tools else None
    if not isinstance(choice, Mapping):
        raise wrong_type("tool_choice", "one of a string or object", choice)
    type_ = choice.get("type")
    if type_ is None:
        raise missing("tool_choice.type")
    if type_ == "function":
        name = read_str(choice, "name", "tool_choice", required=True)
        name = _chosen(body, choice, name, names)
        if name not in names:
            raise ShapeError(
                f"Invalid 'tool_choice': no function named {name!r} is in 'tools'.", "tool_choice.name", "invalid_value"
            )
        return {"type": "function", "function": {"name": name}}
    if type_ == "allowed_tools":
        return _allowed(choice, names, lost)
    if type_ in BUILTIN_TOOLS:
        lost.append(f"tool_choice: the {type_} tool (a tool OpenAI runs itself)")
        return None
    raise invalid_value("tool_choice.type", type_, ("function", "allowed_tools", *BUILTIN_TOOLS))


def _chosen(body: Mapping[str, Any], choice: Mapping[str, Any], name: str | None, names: set[str]) -> str | None:
    """The chat name of a chosen function: a namespace's by its ``namespace`` and name, or
    by its own name when no other function has it."""
    group = read_str(choice, "namespace", "tool_choice")
    if group is not None and name is not None:
        return flat_name(group, name)
    if name in names:
        return name
    matches = [flat for flat, (_, own) in namespaced(body).items() if own == name]
    return matches[0] if len(matches) == 1 else name


def _allowed(choice: Mapping[str, Any], names: set[str], lost: list[str]) -> dict[str, Any] | None:
    mode = read_enum(choice, "mode", "tool_choice", ("auto", "required"))
    if mode is None:
        raise missing("tool_choice.mode")
    listed = read_array(choice, "tools", "tool_choice")
    if listed is None:
        raise missing("tool_choice.tools")
    allowed = []
    for i, tool in enumerate(listed):
        path = at("tool_choice.tools", i)
        if not isinstance(tool, Mapping):
            raise wrong_type(path, "an object", tool)
        if tool.get("type") != "function":
            lost.append(f"{path}: a {tool.get('type')!s} tool in allowed_tools (a tool OpenAI runs itself)")
            continue
        name = read_str(tool, "name", path, required=True)
        if name not in names:
            message = f"Invalid '{path}': no function named {name!r} is in 'tools'."
            raise ShapeError(message, at(path, "name"), "invalid_value")
        allowed.append({"type": "function", "function": {"name": name}})
    if not allowed:
        return None
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": allowed}}


def chat_text_format(body: Mapping[str, Any], chat: dict[str, Any]) -> None:
    """``text`` into ``chat`` (``response_format``, ``verbosity``)."""
    text = read_object(body, "text")
    if text is None:
        return
    verbosity = read_enum(text, "verbosity", "text", ("low", "medium", "high"))
    if verbosity is not None:
        chat["verbosity"] = verbosity
    format_ = read_object(text, "format", "text")
    if format_ is None:
        return
    type_ = read_enum(format_, "type", "text.format", ("text", "json_schema", "json_object"))
    if type_ is None:
        raise missing("text.format.type")
    if type_ == "json_object":
        if not _mentions_json(chat["messages"]):
            raise ShapeError(
                "Response input messages must contain the word 'json' in some form to use 'text.format' of type "
                "'json_object'.",
                "input",
                "invalid_value",
            )
        chat["response_format"] = {"type": "json_object"}
    elif type_ == "json_schema":
        schema = read_object(format_, "schema", "text.format", required=True)
        spec: dict[str, Any] = {"name": _name(format_, "text.format"), "schema": dict(schema or {})}
        description = read_str(format_, "description", "text.format")
        if description is not None:
            spec["description"] = description
        strict = read_bool(format_, "strict", "text.format")
        if strict is not None:
            spec["strict"] = strict
        chat["response_format"] = {"type": "json_schema", "json_schema": spec}


def _mentions_json(messages: list[dict[str, Any]]) -> bool:
    for message in messages:
        content = message.get("content")
        texts = [content] if isinstance(content, str) else [p.get("text") for p in content or ()]
        if any(isinstance(t, str) and "json" in t.lower() for t in texts):
            return True
    return False
