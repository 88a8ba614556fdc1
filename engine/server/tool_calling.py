"""A chat request's tools: checked (400s naming the field, before anything is queued), rendered into the
prompt by the model's own chat template, and its answer's calls read back.

``tool_choice`` ``"none"``: the tools are in the prompt, the answer is content. ``"auto"`` (the default when
there are tools; it needs ``folio serve --enable-auto-tool-choice``): the server's parser
(``--tool-call-parser``, or the model family's default) reads calls out of free text. ``"required"`` and a
named function: the answer is constrained by a grammar built from the functions' ``parameters``
(`folio.engine.tools.choice`), so its arguments always parse and validate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from folio.engine.rules import RuleError
from folio.engine.server.protocol import ChatCompletionRequest, ChatMessage
from folio.engine.structured.params import StructuredOutputsParams
from folio.engine.tools.choice import check_parameters, required_schema
from folio.engine.tools.json_stream import NamedStream, RequiredStream
from folio.engine.tools.parser import ToolParser, ToolStream

Mode = Literal["none", "auto", "required", "named"]
Stream = ToolStream | NamedStream | RequiredStream


@dataclass(frozen=True)
class ToolPlan:
    """How one request's answers are read: ``mode``, the functions offered (name -> parameters schema)."""

    mode: Mode
    functions: dict[str, dict[str, Any]]
    parallel: bool = True
    named: str | None = None  # the function tool_choice names
    parser: ToolParser | None = None  # "auto"'s

    def stream(self) -> Stream | None:
        """A fresh reader of one choice's answer; None when the answer is plain content."""
        if self.mode == "auto":
            assert self.parser is not None
            return self.parser.stream(self.functions, parallel=self.parallel)
        if self.mode == "required":
            return RequiredStream()
        if self.mode == "named":
            assert self.named is not None
            return NamedStream(self.named)
        return None

    @property
    def id_form(self) -> tuple[str, int]:
        """(prefix, length) of this plan's call ids: the parser's (Mistral's templates want 9 characters)."""
        if self.mode == "auto" and self.parser is not None:
            return self.parser.id_prefix, self.parser.id_length
        return "call_", 24


def functions(req: ChatCompletionRequest) -> dict[str, dict[str, Any]]:
    """The request's functions by name, each ``parameters`` checked; RuleError naming the field."""
    found: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(req.tools or ()):
        name = tool.function.name
        if name in found:
            raise RuleError(f"tools[{i}]: function {name!r} is offered twice", param=f"tools[{i}].function.name")
        found[name] = check_parameters(tool.function.parameters, f"tools[{i}].function.parameters")
    return found


def choice(req: ChatCompletionRequest) -> tuple[Mode, str | None]:
    """``tool_choice`` as a mode and, for a named function, its name; checked against the tools."""
    tc = req.tool_choice
    if not req.tools:
        if tc is None or tc == "none":
            return "none", None
        raise RuleError("tool_choice is only allowed when tools are given", param="tool_choice")
    if tc is None:
        return "auto", None
    if isinstance(tc, str):
        return tc, None
    name = tc.function.name
    if all(t.function.name != name for t in req.tools):
        offered = ", ".join(repr(t.function.name) for t in req.tools)
        raise RuleError(f"tool_choice names function {name!r}, which tools does not offer ({offered})",
                        param="tool_choice.function.name")  # fmt: skip
    return "named", name


def constraint(req: ChatCompletionRequest) -> StructuredOutputsParams | None:
    """The grammar a forced call is held to (``"required"`` or a named function), else None."""
    mode, named = choice(req)
    if mode not in ("required", "named"):
        return None
    offered = functions(req)
    if named is not None:
        index = next(i for i, t in enumerate(req.tools or ()) if t.function.name == named)
        return StructuredOutputsParams(json=offered[named], param=f"tools[{index}].function.parameters")
    return StructuredOutputsParams(json=required_schema(offered, req.parallel_tool_calls), param="tools")


def plan(req: ChatCompletionRequest, parser: ToolParser | None) -> ToolPlan | None:
    """The request's plan, or None without tools. ``parser``: the server's for ``"auto"``, None when it was
    started without --enable-auto-tool-choice (then ``"auto"`` is a 400, as vLLM's)."""
    mode, named = choice(req)
    if not req.tools:
        return None
    offered = functions(req)
    if mode == "auto" and parser is None:
        raise RuleError('"auto" tool choice needs the server started with --enable-auto-tool-choice; send '
                        'tool_choice "none", "required" or a named function instead', param="tool_choice")  # fmt: skip
    return ToolPlan(mode, offered, req.parallel_tool_calls, named, parser if mode == "auto" else None)


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The conversation as chat templates read it: OpenAI's ``developer`` is their ``system``; an assistant
    turn's calls carry their arguments as objects (as transformers' templates expect); a tool turn its
    ``tool_call_id``."""
    out = []
    for i, m in enumerate(messages):
        turn: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        if m.name is not None:
            turn["name"] = m.name
        if m.role == "tool":
            if m.tool_call_id is None:
                raise RuleError(f"messages[{i}]: a tool message needs tool_call_id",
                                param=f"messages[{i}].tool_call_id")  # fmt: skip
            turn["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            if m.role != "assistant":
                raise RuleError(f"messages[{i}]: only assistant messages carry tool_calls",
                                param=f"messages[{i}].tool_calls")  # fmt: skip
            turn["tool_calls"] = [_call(c.id, c.function.name, c.function.arguments, f"messages[{i}].tool_calls[{j}]")
                                  for j, c in enumerate(m.tool_calls)]  # fmt: skip
        out.append(turn)
    return out


def _call(call_id: str, name: str, arguments: str, param: str) -> dict[str, Any]:
    try:
        parsed = json.loads(arguments)
    except ValueError as exc:
        raise RuleError(f"{param}.function.arguments is not JSON: {exc}", param=f"{param}.function.arguments") from None
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": parsed}}


def template_tools(req: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The tools as `apply_chat_template(tools=...)` takes them (OpenAI's shape)."""
    if not req.tools:
        return None
    return [t.model_dump(exclude_none=True) for t in req.tools]
