"""Reasoning formats (``farm.proxy.reasoning.ReasoningParser``), named as vLLM's ``--reasoning-parser``.

- ``deepseek_r1``: DeepSeek-R1 and its distills. Their template ends the prompt with ``<think>\\n``,
  so the answer starts inside the reasoning and closes it with ``</think>``; a ``<think>`` the model
  writes itself is dropped. With no ``</think>`` the whole answer is reasoning (as vLLM reads it).
- ``qwen3``: Qwen3 and QwQ. The same tags, read as vLLM's Qwen3 parser does: the answer starts in
  the reasoning (the thinking template may put ``<think>`` in the prompt, or the model writes it),
  a ``<tool_call>`` also ends it (the call is the answer's), a second ``</think>`` is dropped.
- ``glm45``, ``kimi_k2``: the same tags as those families' vLLM parsers read them (their call
  blocks end the reasoning; GLM may open a second ``<think>`` in its answer; the reasoning's
  trailing whitespace is dropped).
- ``openai_gptoss``: gpt-oss. Harmony's ``analysis`` messages are the reasoning; the other
  messages are handed on as written, for the ``openai`` tool-call parser to read.

Each splits the text as it streams: a tag cut across two pushes is held back until it is whole.
"""

from __future__ import annotations

from farm.proxy.reasoning import Split
from farm.proxy.toolparse.harmony import ENDS, MESSAGE, classify
from farm.proxy.toolparse.scan import first_of, partial_tail

THINK = "<think>"
END_THINK = "</think>"
#: the prompt's last ids decoded to see whether the template closed the reasoning (a closed empty
#: think block is at most a few ids in every family's template).
PROMPT_TAIL_IDS = 8


def prompt_ends_reasoning(prompt_tail: str) -> bool:
    """The prompt's generation prompt already closed the think block: Qwen3's template with
    ``enable_thinking: false`` ends it with ``<think>\\n\\n</think>\\n\\n``, llama.cpp's DeepSeek-R1 copy with
    ``<think>\\n</think>``. The model then writes no reasoning; vLLM reads its answer as content."""
    return prompt_tail.rstrip().endswith(END_THINK)


class ThinkTags:
    """``<think>...</think>`` reasoning at the start of the answer (a ``ReasoningParser``).

    ``thinking`` False (the prompt closed the think block: ``prompt_ends_reasoning``): the whole
    answer is content.
    """

    #: tags that end the reasoning and belong to the answer.
    answer_starts: tuple[str, ...] = ()
    #: drop a ``</think>`` written after the reasoning ended.
    drop_late_end = False
    #: a ``<think>`` written in the answer opens reasoning again (GLM).
    reopens = False
    #: the reasoning's trailing whitespace is not reasoning (held until more reasoning follows).
    strip_trailing = False

    def __init__(self, *, thinking: bool = True) -> None:
        self._pending = ""
        self._thinking = thinking
        self._held = ""  # trailing whitespace of the reasoning so far
        self._off = not thinking

    def push(self, text: str) -> Split:
        self._pending += text
        reasoning: list[str] = []
        content: list[str] = []
        while self._pending:
            tags = self._tags()
            at, tag = first_of(self._pending, tags)
            end = at if at >= 0 else len(self._pending) - partial_tail(self._pending, tags)
            if self._thinking:
                reasoning.append(self._reason(self._pending[:end]))
            else:
                content.append(self._pending[:end])
            self._pending = self._pending[end:]
            if at < 0:
                break
            if tag not in (THINK, END_THINK):  # an answer's tag: reasoning ends, the tag is the answer's
                self._thinking = False
                continue
            self._pending = self._pending[len(tag) :]
            if self._thinking and tag == END_THINK:
                self._thinking = False
            elif not self._thinking and tag == THINK:
                self._thinking = True
        return Split(reasoning="".join(reasoning), content="".join(content))

    def finish(self) -> Split:
        """A partial tag left at the end is text of the part it was in."""
        rest, self._pending, self._held = self._pending, "", ""
        return Split(reasoning=self._reason(rest)) if self._thinking else Split(content=rest)

    def _tags(self) -> list[str]:
        if self._off:
            return []
        if self._thinking:
            return [THINK, END_THINK, *self.answer_starts]
        return [END_THINK] * self.drop_late_end + [THINK] * self.reopens

    def _reason(self, text: str) -> str:
        if not self.strip_trailing:
            return text
        text = self._held + text
        body = text.rstrip()
        self._held = text[len(body) :]
        return body


class DeepSeekR1ReasoningParser(ThinkTags):
    """DeepSeek-R1's ``<think>`` reasoning (vLLM's ``deepseek_r1``)."""


class Qwen3ReasoningParser(ThinkTags):
    """Qwen3's ``<think>`` reasoning (vLLM's ``qwen3``)."""

    answer_starts = ("<tool_call>",)
    drop_late_end = True


class Glm45ReasoningParser(ThinkTags):
    """GLM-4.5/4.6/4.7's ``<think>`` reasoning (vLLM's ``glm45``): it may think again mid-answer."""

    answer_starts = ("<tool_call>",)
    drop_late_end = True
    reopens = True
    strip_trailing = True


class KimiK2ReasoningParser(ThinkTags):
    """Kimi K2's ``<think>`` reasoning (vLLM's ``kimi_k2``): its call section ends the reasoning."""

    answer_starts = ("<|tool_calls_section_begin|>",)
    drop_late_end = True
    strip_trailing = True


class HarmonyReasoningParser:
    """gpt-oss's ``analysis`` messages (vLLM's ``openai_gptoss``); the rest passes on as written."""

    def __init__(self) -> None:
        self._pending = ""
        self._body = ""  # "" reading a header, "reasoning" or "pass" in a body
        self._reasoned = False  # some reasoning was handed on
        self._joint = False  # the next message's reasoning joins the last with a newline

    def push(self, text: str) -> Split:
        self._pending += text
        reasoning: list[str] = []
        content: list[str] = []
        while self._pending:
            if not self._body:
                at = self._pending.find(MESSAGE)
                if at < 0:
                    break
                header = self._pending[: at + len(MESSAGE)]
                self._pending = self._pending[len(header) :]
                self._body = "reasoning" if classify(header)[0] == "reasoning" else "pass"
                if self._body == "pass":
                    content.append(header)
                continue
            at, tag = first_of(self._pending, ENDS)
            keep = partial_tail(self._pending, ENDS) if at < 0 else 0
            body = self._pending[: len(self._pending) - keep] if at < 0 else self._pending[:at]
            if self._body == "reasoning":
                reasoning.append(self._reason(body))
            else:
                content.append(body + (tag if at >= 0 else ""))
            if at < 0:
                self._pending = self._pending[len(body) :]
                break
            self._pending = self._pending[at + len(tag) :]
            self._body = ""
            self._joint = self._reasoned  # vLLM joins the analysis messages with a newline
        return Split(reasoning="".join(reasoning), content="".join(content))

    def _reason(self, text: str) -> str:
        if not text:
            return ""
        lead = "\n" if self._joint else ""
        self._reasoned, self._joint = True, False
        return lead + text

    def finish(self) -> Split:
        """An unfinished header or body is text of the part it was in."""
        rest, self._pending = self._pending, ""
        return Split(reasoning=self._reason(rest)) if self._body == "reasoning" else Split(content=rest)
