"""Which earlier completion call a legacy completion prompt extends (``farm.proxy.completion.find``)."""

from __future__ import annotations

import numpy as np

from farm.proxy.completion import find, ids_hash, text_keys
from farm.trials.values import CompletionEnd


def _text_end(seq: int, prompt: str, sampled_text: str, reply: str, stop: str | None = None) -> CompletionEnd:
    return CompletionEnd(
        seq=seq,
        segment=0,
        finish_reason="stop",
        stop_string=stop,
        end_tokens=10 + seq,
        end_hash=b"\0" * 16,
        prompt_hash=b"\1" * 16,
        text_keys=text_keys(prompt, sampled_text, reply),
    )


def _ids_end(seq: int, prompt: list[int], sampled: list[int]) -> CompletionEnd:
    return CompletionEnd(
        seq=seq,
        segment=0,
        finish_reason="length",
        stop_string=None,
        end_tokens=len(prompt) + len(sampled),
        end_hash=ids_hash(prompt + sampled),
        prompt_hash=ids_hash(prompt),
        text_keys=None,
    )


def test_text_prompt_extends_the_longest_call_it_starts_with() -> None:
    ends = [_text_end(0, "Q: a", " b", " b"), _text_end(1, "Q: a b\nQ: c", " d", " d")]
    match = find(ends, "Q: a b\nQ: c d\nQ: e")
    assert match.parent is not None and match.parent.seq == 1 and match.covered == len("Q: a b\nQ: c d")
    # the prompt + reply exactly (a cut-off answer continued) extends too
    assert find(ends, "Q: a b").parent == ends[0]


def test_text_without_what_the_model_sampled_after_the_reply_forks() -> None:
    # the model sampled the stop string (and the harness did not send it back)
    ends = [_text_end(0, "Think:", " x Obs:", " x ", stop="Obs:")]
    match = find(ends, "Think: x \nResult: 1")
    assert match.parent is None and match.compared_with == 0
    assert match.reason is not None and "'Obs:'" in match.reason and "cannot be reused" in match.reason
    # with it, the call extends it
    assert find(ends, "Think: x Obs: 1").parent == ends[0]


def test_text_fork_reasons() -> None:
    ends = [_text_end(0, "hello", " there", " there")]
    assert find([], "anything").reason is None  # the caller says whether it is the first call
    assert find(ends, "hello").reason == "repeats call 0's prompt (a retry, or another sample of it)"
    assert find(ends, "hell").reason == "the prompt does not extend call 0's prompt and reply (nor any earlier call's)"
    ids_only = [_ids_end(0, [1, 2], [3])]
    assert find(ids_only, "text").reason == "the prompt is text, and call 0's was ids: send ids to extend it"


def test_ids_prompt_extends_by_ids() -> None:
    ends = [_ids_end(0, [1, 2], [3, 4]), _ids_end(1, [1, 2, 3, 4, 5], [6])]
    match = find(ends, np.asarray([1, 2, 3, 4, 5, 6, 7], dtype=np.int32))
    assert match.parent == ends[1] and match.covered == 6
    assert find(ends, np.asarray([1, 2, 3, 4], dtype=np.int32)).parent == ends[0]
    retry = find(ends, np.asarray([1, 2, 3, 4, 5], dtype=np.int32))
    assert retry.parent == ends[0]  # a second answer to call 1's prompt branches off call 0
    other = find(ends, np.asarray([1, 9], dtype=np.int32))
    assert other.parent is None and other.compared_with == 1
    assert find([ends[0]], np.asarray([1, 2], dtype=np.int32)).reason == (
        "repeats call 0's prompt (a retry, or another sample of it)"
    )
