"""Continuity for legacy completions (``/v1/completions``): a prompt with no messages to hash.

A completion call *extends* an earlier completion call of its trial when its prompt starts with
that call's prompt followed by what the model sampled:

- a prompt of ids: its ids start with the earlier call's prompt ids + sampled ids;
- a prompt of text: its text starts with the earlier call's prompt text + the text of every id
  the model sampled (a stop string and what followed it, and special tokens such as the end of
  text, included: those ids are in the earlier call's ids). Its ids are then the earlier call's
  ids, reused exactly, + the tokenized rest of the text; the whole text is never re-tokenized,
  which may give other ids than the model sampled.

Among several such calls the longest (then the latest) is the parent. Each call keeps keys of its
prompt and its end: the ids' hash (``end_hash``) and, for text, ``[characters, hash]`` pairs in its
reply's ``text_keys``, so a new prompt is compared by hashing its own prefixes at those lengths.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from farm.db.arrays import INT32
from farm.trials.values import CompletionEnd

_IDS = b"farm-cmpl-ids"
_TEXT = b"farm-cmpl-text"


def _hasher(person: bytes) -> Any:
    return hashlib.blake2b(digest_size=16, person=person)


def ids_hash(ids: Sequence[int] | np.ndarray) -> bytes:
    h = _hasher(_IDS)
    h.update(np.asarray(ids, dtype=INT32).tobytes())
    return bytes(h.digest())


def text_hash(text: str) -> bytes:
    h = _hasher(_TEXT)
    h.update(text.encode("utf-8", "surrogatepass"))
    return bytes(h.digest())


def _prefix_hashes_ids(ids: np.ndarray, lengths: Iterable[int]) -> dict[int, bytes]:
    """The hash of ``ids[:n]`` for each ``n`` in ``lengths`` up to ``len(ids)``: one pass over ``ids``."""
    h, at, out = _hasher(_IDS), 0, {}
    for n in sorted({n for n in lengths if n <= len(ids)}):
        h.update(ids[at:n].tobytes())
        at = n
        out[n] = bytes(h.copy().digest())
    return out


def _prefix_hashes_text(text: str, lengths: Iterable[int]) -> dict[int, bytes]:
    h, at, out = _hasher(_TEXT), 0, {}
    for n in sorted({n for n in lengths if n <= len(text)}):
        h.update(text[at:n].encode("utf-8", "surrogatepass"))
        at = n
        out[n] = bytes(h.copy().digest())
    return out


def _key(text: str) -> list[Any]:
    return [len(text), text_hash(text).hex()]


def text_keys(prompt: str, sampled_text: str, reply_text: str) -> dict[str, Any]:
    """What a text-prompt call keeps to be found again: its prompt, its end (the prompt + the text
    of every sampled id) and what the harness was shown (the prompt + the reply's text)."""
    return {"prompt": _key(prompt), "end": _key(prompt + sampled_text), "shown": _key(prompt + reply_text)}


@dataclass(frozen=True)
class Match:
    """The call a prompt extends and how much of the prompt it covers (characters of a text
    prompt, ids of an ids prompt); or, with no such call, why not."""

    parent: CompletionEnd | None
    covered: int = 0
    reason: str | None = None
    compared_with: int | None = None


def _longest(found: list[tuple[int, int, CompletionEnd]]) -> Match:
    """Of the ends a prompt starts with (covered length, seq, end), the longest, the latest of equals."""
    covered, _, parent = max(found, key=lambda f: (f[0], f[1]))
    return Match(parent=parent, covered=covered)


def find(ends: list[CompletionEnd], prompt: str | np.ndarray) -> Match:
    """The parent of a completion whose prompt is ``prompt`` among the trial's finished
    completion calls ``ends`` (in seq order)."""
    if not ends:
        return Match(parent=None)
    latest = ends[-1]
    if isinstance(prompt, str):
        keyed = [(e, e.text_keys) for e in ends if e.text_keys]
        lengths = {n for _, keys in keyed for n, _ in keys.values()}
        have = _prefix_hashes_text(prompt, lengths)

        def hit(key: list[Any]) -> bool:
            return have.get(key[0]) == bytes.fromhex(key[1])

        found = [(keys["end"][0], e.seq, e) for e, keys in keyed if hit(keys["end"])]
        if found:
            return _longest(found)
        shown = [e for e, keys in keyed if hit(keys["shown"])]
        if shown:
            seq, stop = shown[-1].seq, shown[-1].stop_string
            after = f"the stop string {stop!r}" if stop else "special tokens such as the end of text"
            reason = (
                f"the prompt continues call {seq}'s reply without what the model sampled after it ({after}): "
                "its ids cannot be reused"
            )
            return Match(parent=None, reason=reason, compared_with=seq)
        if latest.text_keys and hit(latest.text_keys["prompt"]) and latest.text_keys["prompt"][0] == len(prompt):
            reason = f"repeats call {latest.seq}'s prompt (a retry, or another sample of it)"
        elif not latest.text_keys:
            reason = f"the prompt is text, and call {latest.seq}'s was ids: send ids to extend it"
        else:
            reason = f"the prompt does not extend call {latest.seq}'s prompt and reply (nor any earlier call's)"
        return Match(parent=None, reason=reason, compared_with=latest.seq)
    have = _prefix_hashes_ids(prompt, {e.end_tokens for e in ends})
    found_ids = [(e.end_tokens, e.seq, e) for e in ends if have.get(e.end_tokens) == e.end_hash]
    if found_ids:
        return _longest(found_ids)
    if latest.prompt_hash == ids_hash(prompt):
        reason = f"repeats call {latest.seq}'s prompt (a retry, or another sample of it)"
    else:
        reason = (
            f"the prompt ids do not start with call {latest.seq}'s prompt ids + sampled ids (nor any earlier call's)"
        )
    return Match(parent=None, reason=reason, compared_with=latest.seq)
