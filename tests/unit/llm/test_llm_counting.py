"""farm.llm.counting: a long text's tokens counted piece by piece, never past what refusing it needs,
never more than the whole text holds (a text that fits is never refused), and a text that fits
tokenized whole, its ids as without the count."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from farm.errors import ContextLengthExceeded
from farm.llm import counting
from farm.llm.counting import TokenBound, count_beyond
from farm.llm.rendering import ChatRenderer
from farm.proxy.bounds import NORMALIZING_SLACK, longest_token_bytes

#: pieces of text where tokenizers split, merge, normalize and mark: cut anywhere among them.
FRAGMENTS = [
    "hello",
    " world",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "\n",
    "\n\n",
    "  ",
    "\t",
    "é",
    "e\u0301",
    "한국어",
    "\u1100\u1161\u11a8",
    "😀",
    "x" * 40,
    "def f(x):",
    "1234567",
    "'s",
]


def reach(tokenizer: Any) -> int:
    return NORMALIZING_SLACK * longest_token_bytes(tokenizer)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    parts=st.lists(st.sampled_from(FRAGMENTS), min_size=50, max_size=600),
    piece=st.sampled_from([17, 64, 301, 1024]),
    data=st.data(),
)
def test_count_beyond_never_counts_more_than_the_whole_text_holds(
    tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch, parts: list[str], piece: int, data: st.DataObject
) -> None:
    monkeypatch.setattr(counting, "PIECE_CHARS", piece)
    text = "".join(parts)
    exact = len(tiny_tokenizer.encode(text, add_special_tokens=False))
    limit = data.draw(st.integers(min_value=0, max_value=exact))
    counted = count_beyond(tiny_tokenizer, text, limit, reach=reach(tiny_tokenizer))
    # Refused only with a count the whole text reaches; a text of exactly the limit is never refused.
    assert counted is None or limit < counted <= exact
    assert count_beyond(tiny_tokenizer, text, exact, reach=reach(tiny_tokenizer)) is None


def test_count_beyond_stops_once_past_the_limit(tiny_tokenizer: Any) -> None:
    # Given a text far longer than the limit, tokenizing it counted
    text = "the harness sent back what it ran\n" * 100_000
    seen: list[int] = []
    backend = tiny_tokenizer.backend_tokenizer

    class Counting:
        def encode(self, piece: str, **kwargs: Any) -> Any:
            seen.append(len(piece))
            return backend.encode(piece, **kwargs)

    class Tokenizer:
        backend_tokenizer = Counting()

    counted = count_beyond(Tokenizer(), text, 20_000, reach=reach(tiny_tokenizer))
    # Then it is refused having tokenized a few pieces past the limit's worth, not the text
    assert counted is not None and counted > 20_000
    assert sum(seen) <= 20_000 * 8 + counting.PIECE_CHARS < len(text) // 10


@pytest.mark.parametrize("counted_first", [True, False], ids=["counted", "short"])
def test_a_text_that_fits_is_tokenized_whole_with_the_ids_it_always_had(
    tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch, counted_first: bool
) -> None:
    if counted_first:  # the tiny tokenizer's texts hold fewer characters per token than the default
        monkeypatch.setattr(counting, "UNCOUNTED_CHARS_PER_TOKEN", 0)
    text = "".join(FRAGMENTS) * 200
    exact = tiny_tokenizer.encode(text, add_special_tokens=False)
    bound = TokenBound(max_tokens=len(exact), reach=reach(tiny_tokenizer))
    assert ChatRenderer(tiny_tokenizer, bound=bound).encode(text) == exact
    with pytest.raises(ContextLengthExceeded, match="proxy.max_prompt_tokens"):
        ChatRenderer(tiny_tokenizer, bound=TokenBound(max_tokens=len(exact) - 1, reach=bound.reach)).encode(text)


def test_a_text_past_the_limit_is_refused_without_being_tokenized_whole(tiny_tokenizer: Any) -> None:
    whole: list[int] = []

    class Tokenizer:
        """The tiny tokenizer, telling what it tokenizes whole (the count goes through its backend)."""

        backend_tokenizer = tiny_tokenizer.backend_tokenizer
        all_special_ids = tiny_tokenizer.all_special_ids
        eos_token_id = tiny_tokenizer.eos_token_id

        def encode(self, text: str, **kwargs: Any) -> list[int]:
            whole.append(len(text))
            return list(tiny_tokenizer.encode(text, **kwargs))

    renderer = ChatRenderer(Tokenizer(), bound=TokenBound(max_tokens=1_000, reach=reach(tiny_tokenizer)))  # type: ignore[arg-type]
    with pytest.raises(ContextLengthExceeded, match="more than"):
        renderer.encode("the model wrote this\n" * 50_000)
    assert whole == []
