"""Append-only trajectories: sampled ids kept verbatim, new messages as the template's delta, forks recorded."""

from __future__ import annotations

import copy

import pytest

from farm.llm.builtin.tiny import CHAT_TEMPLATE
from farm.llm.trajectory import TrajectoryBuilder
from farm.llm.types import FinishReason, GenerateResult


def completion(tokenizer, text, *, eos=True, finish=FinishReason.STOP):
    ids = tokenizer.encode(text, add_special_tokens=False) + ([tokenizer.eos_token_id] if eos else [])
    logprobs = [-0.1 * (i + 1) for i in range(len(ids))]
    return GenerateResult(token_ids=ids, logprobs=logprobs, finish_reason=finish, prompt_tokens=1, backend_id="b")


def rendered(tokenizer, messages):
    return tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)


def test_trajectory_first_prompt_is_the_chat_template_rendering(tiny_tokenizer):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
    builder = TrajectoryBuilder(tokenizer=tiny_tokenizer, messages=messages)
    assert builder.prompt_ids == rendered(tiny_tokenizer, messages)
    assert builder.build().loss_mask == [0] * len(builder.prompt_ids)


def test_trajectory_multi_turn_keeps_sampled_ids_and_matches_full_rendering(tiny_tokenizer):
    builder = TrajectoryBuilder(tokenizer=tiny_tokenizer, messages=[{"role": "user", "content": "list files"}])
    first = completion(tiny_tokenizer, "<tool_call>\nls\n</tool_call>")
    builder.add_completion(first)
    builder.add_messages([{"role": "tool", "content": "a.py b.py"}])
    second = completion(tiny_tokenizer, "done")
    builder.add_completion(second)
    builder.add_messages([{"role": "user", "content": "thanks"}])
    traj = builder.build()

    # Same ids as rendering the whole conversation at once: the deltas are exact for this template.
    assert traj.token_ids == rendered(tiny_tokenizer, builder.messages)
    model_spans = [s for s in traj.turns if s.kind == "model"]
    assert [traj.token_ids[s.start : s.end] for s in model_spans] == [first.token_ids, second.token_ids]
    assert [traj.logprobs[s.start : s.end] for s in model_spans] == [first.logprobs, second.logprobs]
    sampled = {i for s in model_spans for i in range(s.start, s.end)}
    assert traj.loss_mask == [1 if i in sampled else 0 for i in range(len(traj.token_ids))]
    assert all(traj.logprobs[i] == 0.0 for i in range(len(traj.token_ids)) if i not in sampled)
    assert [s.kind for s in traj.turns] == ["prompt", "model", "env", "model", "env"]
    assert traj.forks == []


def test_trajectory_never_retokenizes_sampled_ids(tiny_tokenizer):
    # Ids a tokenizer would never produce for this text (one char at a time) must survive unchanged.
    builder = TrajectoryBuilder(tokenizer=tiny_tokenizer, messages=[{"role": "user", "content": "hi"}])
    odd = [tiny_tokenizer.convert_tokens_to_ids(c) for c in "hello"] + [tiny_tokenizer.eos_token_id]
    assert odd[:-1] != tiny_tokenizer.encode("hello", add_special_tokens=False)
    result = GenerateResult(token_ids=odd, logprobs=[-1.0] * 6, finish_reason="stop", prompt_tokens=1, backend_id="b")
    builder.add_completion(result)
    builder.add_messages([{"role": "user", "content": "again"}])
    traj = builder.build()
    span = traj.turns[1]
    assert traj.token_ids[span.start : span.end] == odd
    assert traj.token_ids[: span.start] == rendered(tiny_tokenizer, [{"role": "user", "content": "hi"}])


def test_trajectory_length_cut_reply_gets_the_end_marker_from_the_template_unmasked(tiny_tokenizer):
    builder = TrajectoryBuilder(tokenizer=tiny_tokenizer, messages=[{"role": "user", "content": "hi"}])
    cut = completion(tiny_tokenizer, "partial answ", eos=False, finish=FinishReason.LENGTH)
    builder.add_completion(cut)
    builder.add_messages([{"role": "user", "content": "go on"}])
    traj = builder.build()
    env = traj.turns[2]
    assert tiny_tokenizer.decode(traj.token_ids[env.start : env.end]).startswith("<|im_end|>\n<|im_start|>user\ngo on")
    assert sum(traj.loss_mask) == len(cut.token_ids)


#: a template that trims a past reply once more follows it (as Qwen3 drops a past reply's reasoning).
TRIMS_PAST_REPLIES = CHAT_TEMPLATE.replace(
    "message['content'] or ''",
    "(message['content'] or '') if loop.last or message['role'] != 'assistant' else (message['content'] or '') | trim",
)


def _past_reply_rewritten(tiny_tokenizer, history):
    """A reply the template trims once a user turn follows it: (builder, reply, the trajectory before the turn)."""
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = TRIMS_PAST_REPLIES
    builder = TrajectoryBuilder(tokenizer=tokenizer, messages=[{"role": "user", "content": "hi"}], history=history)
    reply = completion(tokenizer, "  spaced out  ")
    builder.add_completion(reply)
    before = builder.build()
    builder.add_messages([{"role": "user", "content": "next"}])
    return builder, reply, before


def test_trajectory_template_policy_forks_where_the_template_rewrites_a_past_reply(tiny_tokenizer):
    builder, reply, before = _past_reply_rewritten(tiny_tokenizer, "template")
    tokenizer = builder.tokenizer
    traj = builder.build()

    assert len(traj.forks) == 1
    fork = traj.forks[0]
    assert fork.reason == "the template renders the earlier turns differently once the new messages follow"
    assert fork.before.token_ids == before.token_ids  # the history up to the fork, untouched
    assert sum(fork.before.loss_mask) == len(reply.token_ids)
    assert traj.token_ids == rendered(tokenizer, builder.messages)  # a fresh segment from a full rendering
    assert sum(traj.loss_mask) == 0
    main, others = traj.segments()
    assert main.token_ids == before.token_ids and others == [traj.as_segment()]


def test_trajectory_exact_policy_keeps_the_sampled_reply_where_the_template_rewrites_it(tiny_tokenizer):
    builder, reply, before = _past_reply_rewritten(tiny_tokenizer, "exact")
    tokenizer = builder.tokenizer
    traj = builder.build()

    assert traj.forks == []
    assert traj.token_ids[: len(before.token_ids)] == before.token_ids
    assert (
        tokenizer.decode(traj.token_ids[len(before.token_ids) :])
        == "\n<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n"
    )
    assert sum(traj.loss_mask) == len(reply.token_ids)


def test_trajectory_rejects_two_model_turns_in_a_row(tiny_tokenizer):
    builder = TrajectoryBuilder(tokenizer=tiny_tokenizer, messages=[{"role": "user", "content": "hi"}])
    builder.add_completion(completion(tiny_tokenizer, "a"))
    with pytest.raises(ValueError, match="add_messages"):
        builder.add_completion(completion(tiny_tokenizer, "b"))


def test_trajectory_rejects_new_messages_before_the_first_model_turn(tiny_tokenizer):
    builder = TrajectoryBuilder(tokenizer=tiny_tokenizer, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="needs a model turn before it"):
        builder.add_messages([{"role": "user", "content": "more"}])


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        # the last user message is rendered differently once a reply follows it
        (
            "(message['content'] or '') + ('!' if loop.last and message['role'] == 'user' else '')",
            "a reply follows them",
        ),
        # an earlier reply is rendered differently (as templates that drop old reasoning do)
        (
            "(message['content'] or '') if loop.last or message['role'] != 'assistant' else 'old'",
            "the new messages follow",
        ),
    ],
)
def test_trajectory_fork_names_what_the_template_rendered_differently(tiny_tokenizer, content, reason):
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = CHAT_TEMPLATE.replace("message['content'] or ''", content)
    builder = TrajectoryBuilder(tokenizer=tokenizer, messages=[{"role": "user", "content": "hi"}], history="template")
    builder.add_completion(completion(tokenizer, "done"))
    builder.add_messages([{"role": "user", "content": "next"}])
    traj = builder.build()
    assert [fork.reason for fork in traj.forks] == [f"the template renders the earlier turns differently once {reason}"]
    assert traj.token_ids == rendered(tokenizer, builder.messages)


def test_trajectory_a_segment_the_model_never_saw_is_an_unseen_tail(tiny_tokenizer):
    # An episode that ends right after a fork: the fresh rendering was never sent to the model.
    builder, _, before = _past_reply_rewritten(tiny_tokenizer, "template")
    kept = builder.build()
    main, others = kept.segments()
    assert main.token_ids == before.token_ids and [s.token_ids for s in others] == [kept.token_ids]
    cut = builder.build()
    assert cut.through_last_model_turn() == len(kept.token_ids)
    assert cut.forks == [] and cut.token_ids == before.token_ids and cut.segments() == (cut.as_segment(), [])
