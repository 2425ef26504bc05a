"""Scripted replies for the built-in backend: forced decoding of given text, scored by the real model.

A script is a JSON file::

    {"rules": [{"match": "<regex>", "turns": ["<assistant text for turn 0>", "<turn 1>", ...]}]}

Rules are tried in order; the first whose regex ``re.search``-es the prompt (decoded with special
tokens kept) wins. The turn index is the number of assistant turns already in the prompt: the
template's assistant openings (``<|im_start|>assistant`` in ChatML) minus the final, still open one
(the generation prompt). Past the end of ``turns`` the last entry is reused. A prompt no rule matches
is sampled as usual. A model whose template is not ChatML (Llama 3, Phi-3, DeepSeek-R1) has its
opening and end of turn read from its chat template (``template_markers``).

The engine forces ``tokenizer.encode(text, add_special_tokens=False)`` followed by the end-of-turn id
and reports each forced token's logprob exactly as it would for a sampled one, so a scripted
trajectory is as token-exact as a sampled one.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from farm.errors import ConfigError

#: ChatML (the tiny model's template): what opens an assistant turn and what ends any turn.
CHATML_ASSISTANT_OPENING = "<|im_start|>assistant"
CHATML_END_OF_TURN = "<|im_end|>"


class ScriptRule(BaseModel):
    """One rule: a regex searched in the prompt text and the assistant text for each turn."""

    model_config = ConfigDict(extra="forbid")

    match: str
    turns: list[str] = Field(min_length=1)

    @field_validator("match")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from exc
        return value


class ScriptFile(BaseModel):
    """The script file's content."""

    model_config = ConfigDict(extra="forbid")

    rules: list[ScriptRule]


class _Tokenizer(Protocol):
    def encode(self, text: str, **kwargs: Any) -> list[int]: ...
    def decode(self, token_ids: Any, **kwargs: Any) -> str: ...
    def convert_tokens_to_ids(self, tokens: str) -> Any: ...


@dataclass(frozen=True)
class ScriptedReply:
    """What a matching rule says: which rule, which turn, the text and the ids to force."""

    rule: int
    turn: int
    text: str
    token_ids: list[int]


def load_script(source: Path | str | dict[str, Any]) -> ScriptFile:
    """Read and validate a script from a JSON file or an already parsed dict.

    Raises:
        ConfigError: the file cannot be read, is not JSON, or is not a valid script (the message says where).
    """
    where = "script" if isinstance(source, dict) else f"script file {source}"
    try:
        data = source if isinstance(source, dict) else json.loads(Path(source).read_text(encoding="utf-8"))
        return ScriptFile.model_validate(data)
    except OSError as exc:
        raise ConfigError(f"cannot read {where}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where} is not JSON: {exc}") from exc
    except ValidationError as exc:
        raise ConfigError(f'{where} is not a valid script ({{"rules": [{{"match", "turns"}}]}}): {exc}') from exc


def turn_index(prompt_text: str, *, opening: str = CHATML_ASSISTANT_OPENING, end: str = CHATML_END_OF_TURN) -> int:
    """Assistant turns already in the prompt: the openings, less a last one that is still open."""
    count = prompt_text.count(opening)
    if count and end not in prompt_text[prompt_text.rindex(opening) :]:
        count -= 1  # the generation prompt: the turn about to be written
    return count


#: a reply text no template writes, to find where a rendered assistant turn starts and ends.
_MARK = "SCRIPTED-REPLY-MARK"


def template_markers(tokenizer: Any, stop_ids: frozenset[int]) -> tuple[str, str, int] | None:
    """What the tokenizer's chat template writes around an assistant reply: the turn's opening (the
    part of the generation prompt that every earlier assistant turn also starts with), the end-of-turn
    text and its id, the first id after the reply that the engine stops at. None: no chat template,
    or none of its end-of-turn ids is a stop id."""
    if not isinstance(getattr(tokenizer, "chat_template", None), str):
        return None
    user = [{"role": "user", "content": "u"}]
    try:
        prompt = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
        turn = tokenizer.apply_chat_template([*user, {"role": "assistant", "content": _MARK}], tokenize=False)
    except Exception:  # a template that cannot render this plain conversation has no markers to offer
        return None
    if not isinstance(prompt, str) or not isinstance(turn, str) or _MARK not in turn:
        return None
    # The generation prompt and the rendered reply share the user's turn and the assistant's opening;
    # the opening's first line is what every assistant turn starts with (Qwen3.5 adds a think block).
    before = turn[: turn.index(_MARK)]
    shared = next((i for i, (a, b) in enumerate(zip(prompt, before, strict=False)) if a != b), len(before))
    user_end = _token_boundary(
        tokenizer, prompt, len(os.path.commonprefix([prompt, tokenizer.apply_chat_template(user, tokenize=False)]))
    )
    opening = prompt[user_end:shared].strip().split("\n")[0]
    after = turn[turn.index(_MARK) + len(_MARK) :]
    for i, token_id in enumerate(tokenizer.encode(after, add_special_tokens=False)):
        if token_id in stop_ids:
            end = tokenizer.decode(tokenizer.encode(after, add_special_tokens=False)[: i + 1])
            return (opening, end, token_id) if opening else None
    return None


def _token_boundary(tokenizer: Any, text: str, at: int) -> int:
    """The last token boundary of ``text`` at or before ``at`` (a shared prefix may end inside a token:
    Phi-3's ``<|end|>`` then ``<|endoftext|>`` or ``<|assistant|>``)."""
    position = 0
    for token_id in tokenizer.encode(text, add_special_tokens=False):
        piece = tokenizer.decode([token_id])
        if position + len(piece) > at:
            break
        position += len(piece)
    return position


@dataclass
class Script:
    """Rules bound to a tokenizer; ``reply`` picks the forced ids for a prompt, ``hit`` counts them per rule.

    Args:
        rules: the validated script.
        tokenizer: the served model's tokenizer (decodes prompts, encodes replies).
        end_token_id: appended to every reply; the engine's stop id for the template's end of turn.
        opening, end: the template's assistant-turn opening and end-of-turn text, for the turn index.
    """

    rules: ScriptFile
    tokenizer: _Tokenizer
    end_token_id: int
    opening: str = CHATML_ASSISTANT_OPENING
    end: str = CHATML_END_OF_TURN
    hits: list[int] = field(init=False)
    _patterns: list[re.Pattern[str]] = field(init=False)
    _encoded: dict[str, list[int]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.hits = [0] * len(self.rules.rules)
        self._patterns = [re.compile(rule.match) for rule in self.rules.rules]

    @classmethod
    def for_model(cls, rules: ScriptFile, tokenizer: _Tokenizer, *, stop_ids: frozenset[int]) -> Script:
        """Bind ``rules`` to a served model: replies end with the template's end-of-turn id, a stop id.

        ChatML (``<|im_end|>``) when the engine stops at it; else the markers the tokenizer's chat template
        writes around an assistant turn (``template_markers``: Llama 3's ``<|eot_id|>``, Phi-3's
        ``<|end|>``, DeepSeek's end of sentence).

        Raises:
            ConfigError: neither ChatML's end of turn nor the template's is an id the engine stops at.
        """
        end_id = tokenizer.convert_tokens_to_ids(CHATML_END_OF_TURN)
        if isinstance(end_id, int) and end_id in stop_ids:
            return cls(rules=rules, tokenizer=tokenizer, end_token_id=end_id)
        markers = template_markers(tokenizer, stop_ids)
        if markers is None:
            raise ConfigError(
                f"scripted replies end with the template's end of turn ({CHATML_END_OF_TURN} in ChatML), but this "
                f"model's tokenizer gives it id {end_id!r}, its chat template ends no assistant turn with an id the "
                f"engine stops at, and the engine stops at {sorted(stop_ids)}"
            )
        opening, end, end_id = markers
        return cls(rules=rules, tokenizer=tokenizer, end_token_id=end_id, opening=opening, end=end)

    def match(self, prompt_text: str) -> ScriptedReply | None:
        """The reply the script gives for this prompt text, or None (sample normally). Does not count a hit."""
        for i, (rule, pattern) in enumerate(zip(self.rules.rules, self._patterns, strict=True)):
            if pattern.search(prompt_text):
                turn = turn_index(prompt_text, opening=self.opening, end=self.end)
                text = rule.turns[min(turn, len(rule.turns) - 1)]
                if text not in self._encoded:
                    self._encoded[text] = list(self.tokenizer.encode(text, add_special_tokens=False))
                return ScriptedReply(rule=i, turn=turn, text=text, token_ids=[*self._encoded[text], self.end_token_id])
        return None

    def reply(self, prompt_ids: list[int]) -> ScriptedReply | None:
        """Decode the prompt (special tokens kept) and match it; ``hit`` counts the reply once it is served."""
        if not self._patterns:
            return None
        return self.match(self.tokenizer.decode(prompt_ids, skip_special_tokens=False))

    def hit(self, reply: ScriptedReply) -> None:
        self.hits[reply.rule] += 1

    def report(self) -> list[dict[str, Any]]:
        """Per rule: its regex, how many turns it scripts and how many requests it answered."""
        return [
            {"match": rule.match, "turns": len(rule.turns), "hits": hits}
            for rule, hits in zip(self.rules.rules, self.hits, strict=True)
        ]
