"""The ``openai`` tool-call format (vLLM's ``openai`` parser): gpt-oss, which writes OpenAI's harmony.

The answer is a run of messages. The first one's ``<|start|>assistant`` is in the prompt; each
later one opens with ``<|start|>assistant``. A header (``<|channel|>NAME``, optionally ``to=RECIPIENT``
and a content type such as ``<|constrain|>json``) ends at ``<|message|>``, and the body at
``<|end|>``, ``<|call|>`` or ``<|return|>``. A message to ``functions.NAME`` is a call with the
body as its JSON arguments; ``final`` (and ``commentary`` to no one) is the answer's text;
``analysis`` is reasoning, never prose (``farm.proxy.reasoning_formats`` hands it on as reasoning).
``classify`` reads a header for both.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from farm.proxy.toolparse import CallPiece, Piece, TextPiece
from farm.proxy.toolparse.scan import Tools, dumps, first_of, merge, partial_tail

START = "<|start|>"
MESSAGE = "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
_RECIPIENT = re.compile(r"to=(\S+?)(?=<\||\s|$)")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
#: built-in tools of gpt-oss: their messages are not function calls (vLLM's list).
_BUILTINS = ("browser", "python", "container")


@dataclass(frozen=True)
class Part:
    """A piece of one message's body: ``kind`` is reasoning, content, call or ignore."""

    kind: str
    text: str = ""
    #: for a call: the function's name; the body arrives whole (``text``) once the call ends.
    name: str = ""


class HarmonyMessages:
    """Streams the answer's messages apart: bodies of reasoning and content as they come, calls whole."""

    def __init__(self) -> None:
        self._pending = ""
        self._kind = ""  # "" while reading a header
        self._name = ""
        self._started = False  # a body of this kind was already handed on (to join the next with "\n")
        self._seen: set[str] = set()

    def push(self, text: str) -> list[Part]:
        self._pending += text
        parts: list[Part] = []
        while self._pending:
            if not self._kind:
                at = self._pending.find(MESSAGE)
                if at < 0:
                    break
                header = self._pending[:at]
                self._pending = self._pending[at + len(MESSAGE) :]
                self._kind, self._name = classify(header)
                self._started = False
                continue
            at, tag = first_of(self._pending, ENDS)
            if at < 0:
                if self._kind != "call":
                    keep = partial_tail(self._pending, ENDS + (START,))
                    parts.extend(self._body(self._pending[: len(self._pending) - keep], done=False))
                    self._pending = self._pending[len(self._pending) - keep :]
                break
            parts.extend(self._body(self._pending[:at], done=True))
            self._pending = self._pending[at + len(tag) :].removeprefix(START)
            self._kind = ""
        return parts

    def finish(self) -> list[Part]:
        """The last message ends with the answer. Text never given a header is dropped, as vLLM drops it."""
        rest, self._pending = self._pending, ""
        parts = self._body(rest, done=True) if self._kind else []
        self._kind = ""
        return parts

    def _body(self, text: str, *, done: bool) -> list[Part]:
        if self._kind == "call":
            return [Part("call", text, self._name)]
        if not text and not done:
            return []
        lead = "\n" if not self._started and self._kind in self._seen and text else ""
        if text:
            self._started = True
            self._seen.add(self._kind)
        return [Part(self._kind, lead + text)]


def classify(header: str) -> tuple[str, str]:
    """A header's kind of message (and a call's function name)."""
    recipient = _RECIPIENT.search(header)
    channel = _CHANNEL.search(header)
    name = recipient.group(1) if recipient else ""
    if name and not name.startswith("<|") and name != "assistant" and name.split(".")[0] not in _BUILTINS:
        return "call", name.removeprefix("functions.")
    if name:
        return "ignore", ""
    which = channel.group(1) if channel else ""
    if which == "analysis":
        return "reasoning", ""
    if which in ("final", "commentary"):
        return "content", ""
    return "ignore", ""


class HarmonyToolCallParser:
    """Harmony messages (a ``farm.proxy.toolparse.ToolCallParser``): calls and the final text."""

    def __init__(self, *, tools: Tools | None = None) -> None:
        self._messages = HarmonyMessages()

    def push(self, text: str) -> list[Piece]:
        return _pieces(self._messages.push(text))

    def finish(self) -> list[Piece]:
        return _pieces(self._messages.finish())


def _pieces(parts: list[Part]) -> list[Piece]:
    pieces: list[Piece] = []
    for part in parts:
        if part.kind == "content":
            pieces.append(TextPiece(part.text))
        elif part.kind == "call":
            try:
                arguments = json.loads(part.text)
            except ValueError:
                arguments = None
            if isinstance(arguments, dict) and part.name:
                pieces.append(CallPiece(name=part.name, arguments=dumps(arguments)))
    return merge(pieces)
