"""Loaded into vLLM (``--logits-processors vllm_reply_shapes:ReplyShapes``): every reply of the tiny
qwen3 model gets the shape a Qwen3 agent's reply has, with its words sampled.

A random tiny model writes neither ``<think>`` nor ``<tool_call>`` by itself. This processor masks the
logits, position by position, to a shape: ``<think>\\n`` WORDS ``\\n</think>\\n\\n`` then, while the
conversation has had no tool result, ``<tool_call>\\n{"name": "ls", "arguments": {"path": "``
LETTERS ``"}}\\n</tool_call>``, else WORDS; then ``<|im_end|>``. The fixed pieces are one allowed
id each; WORDS and LETTERS are free spans where the model samples among ``[ ]word`` tokens (nothing
that could close a block or break the JSON string).

Why a logits processor and not vLLM's structured outputs (``structured_outputs.regex``): vLLM applies
a grammar's bitmask to the logits before its sampler takes the logprobs it returns, so under a
grammar vLLM answers the logprobs of the masked distribution, not the model's, and no teacher-forced
recompute matches them. Logits processors run after (``vllm/v1/sample/sampler.py``: raw logprobs
first, then allowed ids, bad words, processors), so the ids are forced or constrained while every
returned logprob is the model's own, which is what the farm records and the test checks.

Runs inside vLLM's environment and imports nothing from the farm.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

#: the tool the shaped call names, and its one string argument.
TOOL = "ls"
#: sampled tokens per free span.
REASONING_WORDS = 6
PATH_PIECES = 2
ANSWER_WORDS = 5


class ReplyShapes(AdapterLogitsProcessor):  # type: ignore[misc]
    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        super().__init__(vllm_config, device, is_pin_memory)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(vllm_config.model_config.tokenizer)

        def ids(text: str) -> list[int]:
            return list(tok.encode(text, add_special_tokens=False))

        (self.tool_response,) = ids("<tool_response>")
        (self.end_of_turn,) = ids("<|im_end|>")
        vocab: dict[str, int] = tok.get_vocab()
        #: the free spans' tokens: " word" ("Ġ" is a space) and "letters".
        self.pools = {
            "words": [i for t, i in vocab.items() if re.fullmatch(r"\u0120[a-z]{2,}", t)],
            "letters": [i for t, i in vocab.items() if re.fullmatch(r"[a-z]{2,}", t)],
        }
        think: list[int | str] = [*ids("<think>\n"), *["words"] * REASONING_WORDS, *ids("\n</think>\n\n")]
        call_open = f'<tool_call>\n{{"name": "{TOOL}", "arguments": {{"path": "'
        call: list[int | str] = [*ids(call_open), *["letters"] * PATH_PIECES, *ids('"}}\n</tool_call>')]
        #: per position of a reply, the one id allowed there or the free span's pool.
        self.call_shape: list[int | str] = [*think, *call, self.end_of_turn]
        self.answer_shape: list[int | str] = [*think, *["words"] * ANSWER_WORDS, self.end_of_turn]
        self.masks: dict[str, torch.Tensor] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params: Any) -> Any:
        return self.shape

    def _mask(self, name: str, size: int) -> torch.Tensor:
        """True where a token may not be sampled in a free span of ``name``."""
        if name not in self.masks:
            mask = torch.ones(size, dtype=torch.bool)
            mask[self.pools[name]] = False
            self.masks[name] = mask
        return self.masks[name]

    def shape(self, prompt_ids: list[int], output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        shape = self.answer_shape if self.tool_response in prompt_ids else self.call_shape
        allowed = shape[min(len(output_ids), len(shape) - 1)]
        if isinstance(allowed, str):
            return logits.masked_fill_(self._mask(allowed, logits.shape[-1]).to(logits.device), float("-inf"))
        keep = logits[allowed].item()
        logits.fill_(float("-inf"))
        logits[allowed] = keep
        return logits
