"""A Responses conversation (input items, after the stored ones) as Chat Completions messages.

- ``message`` items (``type`` may be left out, as the SDK's ``EasyInputMessage`` does):
  ``user`` keeps its content, a string or parts (one text part as a string, the form
  every server reads; ``input_text`` -> ``text``,
  ``input_image`` with an ``image_url`` -> ``image_url``, ``input_file`` with
  ``file_data`` -> ``file``, ``input_audio`` as it is). ``system`` and ``developer`` are
  both ``system``: many OpenAI-compatible servers refuse ``developer``, and OpenAI maps
  ``system`` to it for the models that want it. An ``assistant`` message is its text
  (``output_text`` and ``refusal`` parts joined): what the model said is what it reads.
  Input parts in an assistant message, or output parts in another role's, are refused,
  as OpenAI refuses them (``Invalid value: 'input_text'. Supported values are:
  'output_text' and 'refusal'.``, the part's path as ``param``).
- ``function_call`` items join the assistant message before them (a Chat Completions
  answer is one message, its text and its calls), ``call_id`` becoming the call's ``id``
  (a call with a ``namespace`` is named as the namespace's functions are sent:
  :func:`~._tools.flat_name`);
  ``function_call_output`` is a ``tool`` message, placed right after the message holding
  its call (Chat Completions wants the outputs there; Responses lets other items come
  between). An output with no call before it, a call with no output, and a ``call_id``
  used twice are refused as OpenAI refuses them.
- ``reasoning`` items are dropped: a chat model cannot take them back (OpenAI's are
  encrypted for OpenAI), and its answer does not depend on them.
- Lost (a chat deployment cannot be told them): ``item_reference`` (an item kept by
  OpenAI), images and files given by ``file_id`` or ``file_url``, image ``detail``
  ``original``, a file's rendering ``detail``, images or files in a tool's output, and
  every item of OpenAI's own tools (web search, file search, computer use, code
  interpreter, MCP, image generation, shells, patches, custom tools, tool search...).

Keys the Responses API added to an item and that do not change the answer (``id``,
``status``, ``phase``, ``annotations``, ``logprobs``, ``prompt_cache_breakpoint``,
``caller``) are not read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._common import ShapeError
from ._fields import at, invalid_value, missing, read_array, read_enum, read_str, wrong_type
from ._tools import flat_name

__all__ = ["BUILTIN_ITEMS", "Conversation"]

#: Items of OpenAI's own tools and state (response_input_item_param.py): lost on a chat deployment.
BUILTIN_ITEMS = frozenset(
    {
        "file_search_call",
        "computer_call",
        "computer_call_output",
        "web_search_call",
        "tool_search_call",
        "tool_search_output",
        "additional_tools",
        "configuration_update",
        "compaction",
        "compaction_trigger",
        "image_generation_call",
        "code_interpreter_call",
        "local_shell_call",
        "local_shell_call_output",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "mcp_call",
        "custom_tool_call",
        "custom_tool_call_output",
        "program",
        "program_output",
    }
)
_OWN_ITEMS = ("message", "function_call", "function_call_output", "reasoning", "item_reference")
_ITEM_TYPES = (*_OWN_ITEMS, *sorted(BUILTIN_ITEMS))
_ROLES = ("user", "assistant", "system", "developer")
_INPUT_PARTS = ("input_text", "input_image", "input_file", "input_audio")
_OUTPUT_PARTS = ("output_text", "refusal")
_IMAGE_DETAILS = ("low", "high", "auto", "original")


class Conversation:
    """Items in, one at a time (stored ones first), Chat Completions messages out."""

    __slots__ = ("_answered", "_calls", "_messages", "_replies", "lost")

    def __init__(self) -> None:
        self._messages: list[dict[str, Any]] = []
        #: call_id -> (the index of the assistant message holding it, where the call was)
        self._calls: dict[str, tuple[int, str]] = {}
        self._answered: set[str] = set()
        #: index of an assistant message -> the tool messages answering its calls
        self._replies: dict[int, list[dict[str, Any]]] = {}
        self.lost: list[str] = []

    def add(self, item: Any, path: str) -> None:
        if not isinstance(item, Mapping):
            raise wrong_type(path, "an object", item)
        type_ = item.get("type")
        if type_ is None:  # EasyInputMessage has no type; an ItemReference may have none either
            type_ = "message" if "role" in item else "item_reference" if "id" in item else None
            if type_ is None:
                raise missing(at(path, "type"))
        if not isinstance(type_, str):
            raise wrong_type(at(path, "type"), "a string", type_)
        if type_ == "message":
            self._message(item, path)
        elif type_ == "function_call":
            self._call(item, path)
        elif type_ == "function_call_output":
            self._output(item, path)
        elif type_ == "reasoning":
            read_array(item, "summary", path)  # dropped, but an item of the wrong shape is still refused
        elif type_ == "item_reference":
            read_str(item, "id", path, required=True)
            self.lost.append(f"{path}: an item_reference (an item OpenAI keeps; a chat deployment has none)")
        elif type_ in BUILTIN_ITEMS:
            self.lost.append(f"{path}: a {type_} item (of a tool OpenAI runs itself)")
        else:
            raise invalid_value(path, type_, _ITEM_TYPES)

    def messages(self, where: str = "input") -> list[dict[str, Any]]:
        """The messages so far, each tool reply after its call; a call left unanswered is refused."""
        for call_id in self._calls:
            if call_id not in self._answered:
                raise ShapeError(f"No tool output found for function call {call_id}.", where, "invalid_value")
        out: list[dict[str, Any]] = []
        for i, message in enumerate(self._messages):
            out.append(message)
            out.extend(self._replies.get(i, ()))
        return out

    # -- items ------------------------------------------------------------------------------

    def _message(self, item: Mapping[str, Any], path: str) -> None:
        role = read_enum(item, "role", path, _ROLES)
        if role is None:
            raise missing(at(path, "role"))
        content = item.get("content")
        where = at(path, "content")
        if content is None:
            raise missing(where)
        if role == "assistant":
            self._messages.append({"role": "assistant", "content": _assistant_text(content, where)})
            return
        if isinstance(content, str):
            chat_content: str | list[dict[str, Any]] = content
        elif isinstance(content, (list, tuple)):
            parts = read_array(item, "content", path, nonempty=True) or []
            chat_content = [p for i, part in enumerate(parts) if (p := self._part(part, at(where, i))) is not None]
            if len(chat_content) == 1 and chat_content[0]["type"] == "text":  # the plainest form: any server reads it
                chat_content = chat_content[0]["text"]
        else:
            raise wrong_type(where, "one of a string or array of input content", content)
        self._messages.append({"role": "user" if role == "user" else "system", "content": chat_content})

    def _part(self, part: Any, path: str) -> dict[str, Any] | None:
        if not isinstance(part, Mapping):
            raise wrong_type(path, "an object", part)
        type_ = part.get("type")
        if type_ is None:
            raise missing(at(path, "type"))
        if type_ == "input_text":
            return {"type": "text", "text": read_str(part, "text", path, required=True)}
        if type_ == "input_image":
            return self._image(part, path)
        if type_ == "input_file":
            return self._file(part, path)
        if type_ == "input_audio":
            where = at(path, "input_audio")
            audio = part.get("input_audio")
            if audio is None:
                raise missing(where)
            if not isinstance(audio, Mapping):
                raise wrong_type(where, "an object", audio)
            read_str(audio, "data", where, required=True)
            if read_enum(audio, "format", where, ("mp3", "wav")) is None:
                raise missing(at(where, "format"))
            return {"type": "input_audio", "input_audio": dict(audio)}
        raise invalid_value(path, type_, _INPUT_PARTS)

    def _image(self, part: Mapping[str, Any], path: str) -> dict[str, Any] | None:
        url = read_str(part, "image_url", path)
        file_id = read_str(part, "file_id", path)
        detail = read_enum(part, "detail", path, _IMAGE_DETAILS)
        if url is None and file_id is None:
            raise missing(at(path, "image_url"))
        if url is None:
            self.lost.append(f"{path}: an image given by file_id (a file OpenAI keeps)")
            return None
        if detail == "original":
            self.lost.append(f"{path}: image detail 'original' (Chat Completions takes low, high or auto)")
        image: dict[str, Any] = {"url": url}
        if detail in ("low", "high", "auto"):
            image["detail"] = detail
        return {"type": "image_url", "image_url": image}

    def _file(self, part: Mapping[str, Any], path: str) -> dict[str, Any] | None:
        data = read_str(part, "file_data", path)
        name = read_str(part, "filename", path)
        detail = read_enum(part, "detail", path, ("auto", "low", "high"))
        if data is None:
            if read_str(part, "file_id", path) is None and read_str(part, "file_url", path) is None:
                raise missing(at(path, "file_data"))
            self.lost.append(f"{path}: a file given by file_id or file_url (Chat Completions takes file_data)")
            return None
        if detail not in (None, "auto"):
            self.lost.append(f"{path}: file detail {detail!r} (how OpenAI renders a file for the model)")
        file: dict[str, Any] = {"file_data": data}
        if name is not None:
            file["filename"] = name
        return {"type": "file", "file": file}

    def _call(self, item: Mapping[str, Any], path: str) -> None:
        call_id = read_str(item, "call_id", path, required=True, nonempty=True)
        name = read_str(item, "name", path, required=True)
        arguments = read_str(item, "arguments", path, required=True)
        namespace = read_str(item, "namespace", path)
        assert call_id is not None
        if namespace is not None and name is not None:
            name = flat_name(namespace, name)
        if call_id in self._calls:
            raise ShapeError(
                f"Invalid '{at(path, 'call_id')}': the call_id {call_id!r} is already used by "
                f"{self._calls[call_id][1]}.",
                at(path, "call_id"),
                "invalid_value",
            )
        # a call joins the assistant message just before it (one answer: its text and calls),
        # unless outputs already answered that message: then the model called again after them
        index = len(self._messages) - 1
        if index < 0 or self._messages[index]["role"] != "assistant" or index in self._replies:
            self._messages.append({"role": "assistant", "content": None})
        last = self._messages[-1]
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        last.setdefault("tool_calls", []).append(call)
        self._calls[call_id] = (len(self._messages) - 1, path)

    def _output(self, item: Mapping[str, Any], path: str) -> None:
        call_id = read_str(item, "call_id", path, required=True, nonempty=True)
        assert call_id is not None
        held = self._calls.get(call_id)
        if held is None:
            message = f"No tool call found for function call output with call_id {call_id}."
            raise ShapeError(message, at(path, "call_id"), "invalid_value")
        if call_id in self._answered:
            message = f"Invalid '{path}': the function call {call_id} already has an output."
            raise ShapeError(message, at(path, "call_id"), "invalid_value")
        output = item.get("output")
        where = at(path, "output")
        if output is None:
            raise missing(where)
        if isinstance(output, str):
            text = output
        elif isinstance(output, (list, tuple)):
            text = self._output_text(output, where)
        else:
            raise wrong_type(where, "one of a string or array of output content", output)
        self._answered.add(call_id)
        self._replies.setdefault(held[0], []).append({"role": "tool", "tool_call_id": call_id, "content": text})

    def _output_text(self, parts: Sequence[Any], path: str) -> str:
        """A tool's output parts as one string: a Chat Completions tool message takes text only."""
        texts = []
        for i, part in enumerate(parts):
            where = at(path, i)
            if not isinstance(part, Mapping):
                raise wrong_type(where, "an object", part)
            type_ = part.get("type")
            if type_ == "input_text":
                texts.append(read_str(part, "text", where, required=True) or "")
            elif type_ in ("input_image", "input_file"):
                self.lost.append(f"{where}: an {type_[6:]} in a tool's output (a chat tool message is text)")
            elif type_ is None:
                raise missing(at(where, "type"))
            else:
                raise invalid_value(where, type_, ("input_text", "input_image", "input_file"))
        return "".join(texts)


def _assistant_text(content: Any, path: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, (list, tuple)):
        raise wrong_type(path, "one of a string or array of output content", content)
    texts = []
    for i, part in enumerate(content):
        where = at(path, i)
        if not isinstance(part, Mapping):
            raise wrong_type(where, "an object", part)
        type_ = part.get("type")
        if type_ == "output_text":
            texts.append(read_str(part, "text", where, required=True) or "")
        elif type_ == "refusal":
            texts.append(read_str(part, "refusal", where, required=True) or "")
        elif type_ is None:
            raise missing(at(where, "type"))
        else:
            raise invalid_value(where, type_, _OUTPUT_PARTS)
    return "".join(texts)
