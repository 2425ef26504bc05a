"""Counting a text's tokens up to a limit, with work bounded by the limit rather than the text.

A harness may send megabytes of text that cannot fit any context; tokenizing all of it only to
refuse it costs time and memory in proportion to the text (a 4 MB message: ~4 M ids, ~250 MB).
``TokenBound.check`` counts a long text piece by piece and stops once it has passed the limit;
the text is tokenized for real, whole and once, only when it may fit, so a prompt's ids never
depend on the counting.

The count is a lower bound of the whole text's tokens, so a text that fits is never refused.
Tokenizing two pieces apart may split what the whole would join (a merge across the cut, a
normalizer composing characters there), and may only change tokens near the cut: each cut is
charged every token of its two pieces within ``reach`` characters of it (no token spans more of
the text than that), which the whole text may have tokenized differently. Pieces are cut after a
newline or before a space where one is near, where pre-tokenizers split anyway, so the counts
there are usually exact; a text with no such place for a whole piece is cut where it must be.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from farm.errors import ContextLengthExceeded

#: characters tokenized at a time while counting.
PIECE_CHARS = 1 << 16
#: texts of at most this many characters per token of the limit are tokenized whole without
#: counting first (their tokenizing is already bounded by the limit; counting would double it).
UNCOUNTED_CHARS_PER_TOKEN = 4
#: tokens one character may take at most (UTF-8 bytes, for byte-level and byte-fallback tokenizers).
MAX_TOKENS_PER_CHAR = 4


@dataclass(frozen=True)
class TokenBound:
    """At most ``max_tokens`` tokens for one text; no token spans more than ``reach`` characters."""

    max_tokens: int
    reach: int

    def check(self, tokenizer: Any, text: str) -> None:
        """Refuse ``text`` if it holds more than ``max_tokens`` tokens, counting no further than that.

        Raises:
            ContextLengthExceeded: it holds more (400: the harness shortens its conversation).
        """
        if len(text) <= UNCOUNTED_CHARS_PER_TOKEN * self.max_tokens:
            return
        counted = count_beyond(tokenizer, text, self.max_tokens, reach=self.reach)
        if counted is not None:
            raise self.refusal(f"more than {counted}", len(text))

    def check_ids(self, ids: int, chars: int) -> None:
        """Refuse a text tokenized whole (not counted first: short enough) into more than ``max_tokens`` ids.

        Raises:
            ContextLengthExceeded: it holds more.
        """
        if ids > self.max_tokens:
            raise self.refusal(str(ids), chars)

    def refusal(self, tokens: str, chars: int) -> ContextLengthExceeded:
        return ContextLengthExceeded(
            f"the prompt holds {tokens} tokens ({chars} characters), past the longest context served "
            f"({self.max_tokens} tokens, proxy.max_prompt_tokens): shorten the conversation",
            status=400,
        )


def count_beyond(tokenizer: Any, text: str, limit: int, *, reach: int) -> int | None:
    """A lower bound of ``text``'s tokens once it passes ``limit``, or None if the text may fit.

    Tokenizes at most about ``limit`` tokens plus one piece (see the module docstring).
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    counted = 0
    start = 0
    while start < len(text):
        end = _cut(text, start)
        piece = text[start:end]
        cut_before, cut_after = start > 0, end < len(text)
        if backend is not None:
            offsets = backend.encode(piece, add_special_tokens=False).offsets
            # Tokens near a cut are not counted: the whole text may have tokenized that stretch otherwise.
            tail = len(piece) - reach
            counted += sum(
                1 for begin, stop in offsets if not ((cut_before and begin < reach) or (cut_after and stop > tail))
            )
        else:
            counted += len(tokenizer.encode(piece, add_special_tokens=False))
            counted -= (cut_before + cut_after) * reach * MAX_TOKENS_PER_CHAR
        if counted > limit:
            return counted
        start = end
    return None


def _cut(text: str, start: int) -> int:
    """Where the piece from ``start`` ends: after the last newline before non-space in its second
    half, else before the last space after non-space there, else at ``PIECE_CHARS``."""
    end = start + PIECE_CHARS
    if end >= len(text):
        return len(text)
    low = start + PIECE_CHARS // 2
    at = text.rfind("\n", low, end - 1)
    while at >= 0 and text[at + 1].isspace():
        at = text.rfind("\n", low, at)
    if at >= 0:
        return at + 1
    at = text.rfind(" ", low + 1, end)
    while at >= 0 and text[at - 1].isspace():
        at = text.rfind(" ", low + 1, at)
    return at if at >= 0 else end
