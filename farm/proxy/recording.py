"""A call's third step: what its record holds, as the trial's statements take it
(``farm.trials.values``). The core sends these through its ``farm.trials.recorder.CallRecorder``."""

from __future__ import annotations

from typing import Any

import numpy as np

from farm.proxy import completion
from farm.proxy.conversation import Reply, extend
from farm.proxy.generate import Generated
from farm.proxy.prepare import Prepared
from farm.trials.values import CallFinish, CallStart


def call_start(prepared: Prepared, *, wire: str, streamed: bool) -> CallStart:
    """The call's pending row."""
    return CallStart(
        parent=prepared.parent,
        wire=wire,
        streamed=streamed,
        message_hashes=prepared.hashes,
        delta_ids=prepared.delta,
        prompt_tokens=len(prepared.prompt_ids),
        continuity=prepared.continuity.as_dict(),
        messages=prepared.messages,
    )


def call_finish(prepared: Prepared, generated: Generated, *, tokenizer: Any) -> CallFinish:
    """The call's finish: what it sampled, the reply given, and its end hash (what a later call
    that extends it finds it by)."""
    reply = generated.reply
    if prepared.completion:
        end_hash, extra = _completion_end(prepared, generated.sampled, reply, tokenizer)
    else:
        end_hash, extra = extend(prepared.hashes[-1], reply.message()), {}
    unmet = generated.tool_choice_unmet
    return CallFinish(
        sampled_ids=generated.sampled,
        logprobs=generated.logprobs,
        finish_reason=reply.finish_reason,
        reply={**reply.model_dump(mode="json"), **extra},
        end_hash=end_hash,
        backend_id=generated.backend_id,
        first_token_s=generated.first_token_s,
        latency_s=generated.latency_s,
        weight_versions=generated.weight_versions,
        continuity={**prepared.continuity.as_dict(), "tool_choice_unmet": unmet} if unmet else None,
    )


def _completion_end(
    prepared: Prepared, sampled: list[int], reply: Reply, tokenizer: Any
) -> tuple[bytes, dict[str, Any]]:
    """A legacy completion's end keys: the hash of its ids, and for a text prompt its text keys."""
    ids = np.concatenate([prepared.prompt_ids, np.asarray(sampled, dtype=np.int32)])
    extra: dict[str, Any] = {"text_keys": None}
    if prepared.prompt_text is not None:
        sampled_text = str(tokenizer.decode(sampled, skip_special_tokens=False))
        extra["text_keys"] = completion.text_keys(prepared.prompt_text, sampled_text, reply.content)
    return completion.ids_hash(ids), extra
