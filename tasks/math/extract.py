"""Find the final answer in a model's response and bring it to a canonical string.

Extraction rules, first that applies wins:

1. The last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces; ``\\boxed 5`` also
   counts. Only the last box is graded, so boxing several candidates earns nothing more.
2. The last "answer is X" / "answer: X" / "Answer = X" phrase: X runs to the end of its line,
   or to a sentence-ending period.
3. A last line that is nothing but a number (``42``, ``$3/4$``).

Nothing else: a response that states no final answer has none. (It used to fall back to the
last number anywhere in the text, so a random reply ending in "5" scored 1 on a problem whose
answer is 5.) An answer that offers alternatives ("3 or 4", ``3 \\text{ or } 4``) is no answer,
and the grader refuses numbers side by side (``3 4``), which sympy would multiply.

Normalisation (``normalize``) then removes what does not change the value: ``$`` delimiters,
``\\left``/``\\right`` and LaTeX spacing, ``\\dfrac``/``\\tfrac`` (-> ``\\frac``), thousands
separators, a leading currency sign, a trailing percent sign, degrees, ``\\text{...}`` units and
trailing unit words (``12 apples`` -> ``12``), a single-variable assignment (``x = 3`` -> ``3``),
a trailing period, and spaces. So ``3/4``, ``0.75`` and ``\\frac{3}{4}`` all reach the grader as
values it can compare; ``25%`` and ``25`` are the same answer, ``0.25`` is not.
"""

from __future__ import annotations

import re

#: responses longer than this are cut (from the front: answers come last) before any regex runs.
MAX_RESPONSE_CHARS = 20_000
#: an extracted answer longer than this is not an answer.
MAX_ANSWER_CHARS = 500

_BOX = re.compile(r"\\(?:boxed|fbox)\s*")
_ANSWER_PHRASE = re.compile(r"answer\s*(?:is|:|=)\s*:?\s*", re.IGNORECASE)
_BARE_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")
#: an answer that offers alternatives ("3 or 4", "3 \\text{ or } 4", "3 \\lor 4").
_ALTERNATIVES = re.compile(r"\bor\b|\\lor\b|\\vee\b", re.IGNORECASE)
_THOUSANDS = re.compile(r"(?<![\d.])(\d{1,3}(?:,\d{3})+)(?![\d,])")
_TEXT_GROUP = re.compile(r"\\(?:text|textbf|mathrm|mbox|textit)\s*\{([^{}]*)\}")
_ASSIGNMENT = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*(.+)$")
# Words are separated by required whitespace so the pattern cannot backtrack exponentially.
_UNIT_WORDS = re.compile(r"^(.*?\d)\s*([A-Za-z]{2,}(?:\.?\s+[A-Za-z]{2,})*\.?)$")
_SPACING = re.compile(r"\\[,;:! ]|\\quad|\\qquad|~")


def _brace_pairs(text: str) -> dict[int, int]:
    """Index of each ``{`` -> index of its ``}``, in one pass (unbalanced ones are left out)."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for i, ch in enumerate(text):
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            pairs[stack.pop()] = i
    return pairs


def _boxed(text: str) -> list[str]:
    """Every ``\\boxed`` answer in the text, in order."""
    found = []
    pairs: dict[int, int] | None = None
    for match in _BOX.finditer(text):
        start = match.end()
        if text.startswith("{", start):
            pairs = _brace_pairs(text) if pairs is None else pairs
            if start in pairs:
                found.append(text[start + 1 : pairs[start]])
        elif bare := re.match(r"[^\s$]+", text[start : start + MAX_ANSWER_CHARS]):
            found.append(bare.group(0))
    return found


def _last_boxed(text: str) -> str | None:
    boxes = _boxed(text)
    return boxes[-1] if boxes else None


def _bare_last_line(text: str) -> str | None:
    """A last line that is nothing but a number (``42``, ``$3/4$``): a stated answer."""
    lines = text.strip().splitlines()
    last = lines[-1].strip().strip("$").strip() if lines else ""
    return last if _BARE_NUMBER.fullmatch(last) else None


def _last_phrase(text: str) -> str | None:
    found = None
    for match in _ANSWER_PHRASE.finditer(text):
        rest = text[match.end() :].split("\n", 1)[0]
        # A period ends the sentence only when a space or the end follows ("3.5" keeps its point).
        rest = re.split(r"\.(?:\s|$)", rest, maxsplit=1)[0]
        if rest.strip():
            found = rest
    return found


def extract_answer(response: str) -> str | None:
    """The raw final answer of a response (before ``normalize``), or None when there is none."""
    text = response[-MAX_RESPONSE_CHARS:]
    for finder in (_last_boxed, _last_phrase, _bare_last_line):
        found = finder(text)
        if found is not None:
            answer = found.strip()[:MAX_ANSWER_CHARS]
            return None if not answer or _ALTERNATIVES.search(answer) else answer
    return None


def _strip_text_groups(s: str) -> str:
    without = _TEXT_GROUP.sub("", s).strip()
    # "5 \text{cm}" -> "5"; but "\text{yes}" alone is the answer itself.
    return without if without else _TEXT_GROUP.sub(r"\1", s)


def normalize(answer: str) -> str:
    """Canonical form of an extracted answer (see the module docstring)."""
    s = answer.strip()[:MAX_ANSWER_CHARS]
    s = s.strip("$").replace("\\$", "").replace("$", "")
    if s.startswith("\\(") and s.endswith("\\)"):
        s = s[2:-2]
    s = s.replace("\\left", "").replace("\\right", "").replace("\\displaystyle", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("{,}", ",")
    s = re.sub(r"(\d)\\,(\d{3})", r"\1\2", s)  # LaTeX thin-space thousands separator
    s = _SPACING.sub(" ", s)
    s = _strip_text_groups(s)
    s = re.sub(r"\^\s*\{?\\circ\}?|°|\\degree", "", s)
    s = re.sub(r"\\?%|\\percent", "", s)
    s = s.strip().rstrip(".").strip()
    match = _ASSIGNMENT.match(s)
    if match and "=" not in match.group(1):
        s = match.group(1).strip()
    match = _UNIT_WORDS.match(s)
    if match and not re.search(r"\\[A-Za-z]+$", match.group(1)):
        s = match.group(1)
    s = _THOUSANDS.sub(lambda m: m.group(1).replace(",", ""), s)
    return re.sub(r"\s+", " ", s).strip()
