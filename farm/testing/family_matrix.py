"""The family matrix: a model family's multi-turn conversation through the proxy, on each wire format.

One conversation per cell (family x format x streamed): the harness asks with a tool offered, the
model thinks and calls the tool in its family's own format, the harness sends the tool's result,
the model answers, the user thanks it, the model answers again (three calls). A family with no
reasoning parser does not think; one with no tool-call parser answers a user turn instead of
calling. What the model writes is taken from the family's own chat template (``plan_for``: the
rendering of the same assistant message after the generation prompt), so no format is written out
here. The built-in backend's script mode (``farm.llm.builtin.script``) forces that text.

``converse`` drives one cell with the real ``openai`` or ``anthropic`` SDK and returns what the SDK
read; ``check_record`` compares a trial's record with the script: drift (a model id that is not the
script's), the largest difference between a recorded logprob and a teacher-forced recompute, and the
segments. ``tests/integration/proxy/test_proxy_family_matrix.py`` and ``bench/fidelity.py`` use both.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from farm.llm.builtin.script import template_markers
from farm.llm.families import FAMILIES
from farm.proxy.reasoning_formats import prompt_ends_reasoning

#: the script's rule matches prompts that carry it.
WORD = "FAMILYMATRIX"
FORMATS = ("chat", "responses", "anthropic")
TOOL_NAME = "bash"
ARGUMENTS = {"cmd": "ls"}
TOOL_RESULT = "a.txt"
PARAMETERS = {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}
CHAT_TOOLS: Any = [{"type": "function", "function": {"name": TOOL_NAME, "parameters": PARAMETERS}}]
RESPONSES_TOOLS: Any = [{"type": "function", "name": TOOL_NAME, "parameters": PARAMETERS}]
ANTHROPIC_TOOLS: Any = [{"name": TOOL_NAME, "input_schema": PARAMETERS}]
MAX_TOKENS = 96
#: Anthropic wants max_tokens above a thinking budget (at least 1024); the scripted reply is short anyway.
THINKING_MAX_TOKENS = 2048
THINK_OPEN = "<think>\n"


@dataclass(frozen=True)
class Turn:
    """One reply: what the harness should read, and the text the model writes for it."""

    reasoning: str | None
    content: str
    calls_tool: bool
    text: str


@dataclass(frozen=True)
class Plan:
    """A family's conversation: the user's turns between the replies and the replies."""

    family: str
    thinks: bool
    calls_tools: bool
    turns: tuple[Turn, ...]
    #: what the template needs to write the conversation (``enable_thinking`` for DeepSeek-R1): each
    #: format asks for it with its own thinking switch (``farm.proxy.template_kwargs``).
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    def switch(self, fmt: str) -> dict[str, Any]:
        """The request fields that ask for ``template_kwargs`` in ``fmt``."""
        if "enable_thinking" not in self.template_kwargs:
            return {}
        on = bool(self.template_kwargs["enable_thinking"])
        if fmt == "chat":
            return {"extra_body": {"chat_template_kwargs": self.template_kwargs}}
        if fmt == "responses":
            return {"reasoning": {"effort": "low" if on else "none"}}
        return {"thinking": {"type": "enabled", "budget_tokens": 1024} if on else {"type": "disabled"}}

    def script(self) -> dict[str, Any]:
        return {"rules": [{"match": WORD, "turns": [t.text for t in self.turns]}]}


@dataclass
class Read:
    """What the SDK read of one call."""

    reasoning: str
    content: str
    calls: list[tuple[str, Any]] = field(default_factory=list)
    #: the usage's reasoning tokens where the format reports them (None: not reported).
    reasoning_tokens: int | None = None


def _template_messages(family: str, thinks: bool, calls: bool) -> tuple[list[list[Any]], list[Turn]]:
    """The messages before each reply as the template sees them, and each reply's wanted reading."""
    wanted = [
        Turn("look first" if thinks else None, "" if calls else "I will look.", calls, ""),
        Turn("seen it" if thinks else None, f"found {TOOL_RESULT}", False, ""),
        Turn("welcome" if thinks else None, "bye", False, ""),
    ]
    history: list[Any] = [{"role": "user", "content": f"{WORD}: list files"}]
    befores = [list(history)]
    for i, turn in enumerate(wanted[:-1]):
        history.append(_assistant(turn, f"call_{i}"))
        if turn.calls_tool:
            history.append({"role": "tool", "tool_call_id": f"call_{i}", "name": TOOL_NAME, "content": TOOL_RESULT})
        else:
            history.append({"role": "user", "content": "go on" if i == 0 else "thanks"})
        befores.append(list(history))
    return befores, wanted


def _assistant(turn: Turn, call_id: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": turn.content}
    if turn.reasoning is not None:
        message["reasoning_content"] = turn.reasoning
    if turn.calls_tool:
        call = {"name": TOOL_NAME, "arguments": dict(ARGUMENTS)}
        message["tool_calls"] = [{"id": call_id, "type": "function", "function": call}]
    return message


def plan_for(family: str, tokenizer: Any, stop_ids: frozenset[int]) -> Plan:
    """The family's conversation, each reply written as the family's template writes that message.

    Raises:
        ValueError: the template writes no end of turn the engine stops at, or a reply cannot be
            found in its rendering.
    """
    spec = FAMILIES[family]
    markers = template_markers(tokenizer, stop_ids)
    if markers is None:
        raise ValueError(f"{family}: the chat template ends no assistant turn with a stop id")
    opening, end, _ = markers
    tools = CHAT_TOOLS if spec.tool_call_parser else None

    def render(messages: list[Any], kwargs: dict[str, Any], *, prompt: bool) -> str:
        return str(
            tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=prompt, **kwargs)
        )

    user: list[Any] = [{"role": "user", "content": "u"}]
    # A template that closes the think block in its generation prompt (llama.cpp's DeepSeek-R1 copy)
    # opens it when asked to (``enable_thinking``): the conversation asks, through each format's switch.
    kwargs: dict[str, Any] = {}
    if spec.reasoning_parser is not None and prompt_ends_reasoning(render(user, {}, prompt=True)):
        kwargs = {"enable_thinking": True}
    thinks = spec.reasoning_parser is not None and not prompt_ends_reasoning(render(user, kwargs, prompt=True))
    befores, wanted = _template_messages(family, thinks, spec.tool_call_parser is not None)
    turns = []
    for i, (before, turn) in enumerate(zip(befores, wanted, strict=True)):
        prompt = render(before, kwargs, prompt=True)
        whole = render([*before, _assistant(turn, f"call_{i}")], kwargs, prompt=False)
        if whole.startswith(prompt):
            body = whole[len(prompt) :]
        else:  # the generation prompt is not how the template opens a written reply (an opened think block)
            body = whole[whole.rindex(opening) + len(opening) :].lstrip("\n")
        if end not in body:
            raise ValueError(f"{family}: no end of turn {end!r} after reply {i} in {whole!r}")
        text = body[: body.index(end)]
        if turn.reasoning is not None and turn.reasoning not in text:
            if not prompt.endswith(THINK_OPEN):
                raise ValueError(f"{family}: the template does not write reply {i}'s reasoning: {text!r}")
            # DeepSeek-R1's template drops every reply's reasoning; the prompt opened the block, so
            # the model writes its reasoning, closes the block and answers.
            text = f"{turn.reasoning}\n</think>\n\n{text}"
        turns.append(Turn(turn.reasoning, turn.content, turn.calls_tool, text))
    calls = spec.tool_call_parser is not None
    return Plan(family=family, thinks=thinks, calls_tools=calls, turns=tuple(turns), template_kwargs=kwargs)


def converse(fmt: str, streamed: bool, plan: Plan, trial: dict[str, Any]) -> list[Read]:
    """Drive the plan's three calls with the real SDK of ``fmt``; what the SDK read of each."""
    if fmt == "chat":
        return _chat(plan, trial, streamed)
    if fmt == "responses":
        return _responses(plan, trial, streamed)
    return _anthropic(plan, trial, streamed)


def _next_user(plan: Plan, i: int) -> str:
    return "thanks" if i == 1 or plan.calls_tools else "go on"


def _chat(plan: Plan, trial: dict[str, Any], streamed: bool) -> list[Read]:
    import openai

    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    messages: Any = [{"role": "user", "content": f"{WORD}: list files"}]
    extra: Any = {"tools": CHAT_TOOLS} if plan.calls_tools else {}
    extra |= plan.switch("chat")
    reads = []
    for i in range(3):
        if streamed:
            read, message = _chat_stream(client, messages, extra)
        else:
            answer = client.chat.completions.create(model="m", messages=messages, max_tokens=MAX_TOKENS, **extra)
            msg = answer.choices[0].message
            calls = [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls or []]
            reasoning = str((msg.model_extra or {}).get("reasoning_content") or "")
            details = answer.usage.completion_tokens_details if answer.usage else None
            read = Read(reasoning, msg.content or "", calls, details.reasoning_tokens if details else None)
            message = msg.model_dump(exclude_none=True)
        reads.append(read)
        messages.append(message)
        if read.calls:
            call_id = message["tool_calls"][0]["id"]
            messages.append({"role": "tool", "tool_call_id": call_id, "content": TOOL_RESULT})
        else:
            messages.append({"role": "user", "content": _next_user(plan, i)})
    return reads


def _chat_stream(client: Any, messages: Any, extra: Any) -> tuple[Read, dict[str, Any]]:
    reasoning, content = "", ""
    calls: dict[int, dict[str, str]] = {}
    for chunk in client.chat.completions.create(
        model="m", messages=messages, max_tokens=MAX_TOKENS, stream=True, **extra
    ):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        content += delta.content or ""
        for piece in delta.tool_calls or []:
            call = calls.setdefault(piece.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += piece.id or ""
            if piece.function is not None:
                call["name"] += piece.function.name or ""
                call["arguments"] += piece.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls.values()
        ]
    read = Read(reasoning, content, [(c["name"], json.loads(c["arguments"])) for c in calls.values()])
    return read, message


def _responses(plan: Plan, trial: dict[str, Any], streamed: bool) -> list[Read]:
    import openai

    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    items: Any = [{"role": "user", "content": f"{WORD}: list files"}]
    extra: Any = {"tools": RESPONSES_TOOLS} if plan.calls_tools else {}
    extra |= plan.switch("responses")
    reads = []
    for i in range(3):
        if streamed:
            final: Any = None
            for event in client.responses.create(
                model="m", input=items, max_output_tokens=MAX_TOKENS, stream=True, **extra
            ):
                if event.type == "response.completed":
                    final = event.response
            assert final is not None, "the stream ended without response.completed"
        else:
            final = client.responses.create(model="m", input=items, max_output_tokens=MAX_TOKENS, **extra)
        reasoning = "".join(c.text for o in final.output if o.type == "reasoning" for c in o.content or [])
        calls = [(o.name, json.loads(o.arguments)) for o in final.output if o.type == "function_call"]
        tokens = final.usage.output_tokens_details.reasoning_tokens if final.usage else None
        reads.append(Read(reasoning, final.output_text, calls, tokens))
        items += [o.model_dump(exclude_none=True) for o in final.output]
        for o in final.output:
            if o.type == "function_call":
                items.append({"type": "function_call_output", "call_id": o.call_id, "output": TOOL_RESULT})
        if not calls:
            items.append({"role": "user", "content": _next_user(plan, i)})
    return reads


def _anthropic(plan: Plan, trial: dict[str, Any], streamed: bool) -> list[Read]:
    import anthropic

    client = anthropic.Anthropic(base_url=trial["anthropic_base_url"], api_key=trial["key"])
    messages: Any = [{"role": "user", "content": f"{WORD}: list files"}]
    extra: Any = {"tools": ANTHROPIC_TOOLS} if plan.calls_tools else {}
    extra |= plan.switch("anthropic")
    max_tokens = THINKING_MAX_TOKENS if "thinking" in extra else MAX_TOKENS
    reads = []
    for i in range(3):
        final: Any
        if streamed:
            with client.messages.stream(model="m", max_tokens=max_tokens, messages=messages, **extra) as stream:
                for _ in stream:
                    pass
                final = stream.get_final_message()
        else:
            final = client.messages.create(model="m", max_tokens=max_tokens, messages=messages, **extra)
        blocks = final.content
        reasoning = "".join(b.thinking for b in blocks if b.type == "thinking")
        content = "".join(b.text for b in blocks if b.type == "text")
        calls = [(b.name, b.input) for b in blocks if b.type == "tool_use"]
        reads.append(Read(reasoning, content, calls))
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in blocks]})
        uses = [b for b in blocks if b.type == "tool_use"]
        if uses:
            results = [{"type": "tool_result", "tool_use_id": b.id, "content": TOOL_RESULT} for b in uses]
            messages.append({"role": "user", "content": results})
        else:
            messages.append({"role": "user", "content": _next_user(plan, i)})
    return reads


def reasoning_token_counts(plan: Plan, tokenizer: Any) -> list[int]:
    """Each reply's scripted ids between its think tags (from the start when the prompt opened the block)."""
    counts = []
    for turn in plan.turns:
        ids = tokenizer.encode(turn.text, add_special_tokens=False)
        start_id, end_id = tokenizer.convert_tokens_to_ids("<think>"), tokenizer.convert_tokens_to_ids("</think>")
        if turn.reasoning is None or end_id not in ids:
            counts.append(0)
            continue
        start = ids.index(start_id) + 1 if start_id in ids else 0
        counts.append(ids.index(end_id) - start)
    return counts


def read_problems(plan: Plan, reads: Sequence[Read], tokenizer: Any) -> list[str]:
    """Where what the SDK read differs from the plan (reasoning, answer, tool calls, the usage's
    reasoning tokens where reported); empty: none."""
    problems = []
    counts = reasoning_token_counts(plan, tokenizer)
    for i, (turn, read) in enumerate(zip(plan.turns, reads, strict=True)):
        if read.reasoning_tokens is not None and read.reasoning_tokens != counts[i]:
            problems.append(f"call {i}: reasoning_tokens {read.reasoning_tokens}, wanted {counts[i]}")
        if (read.reasoning.strip() or None) != turn.reasoning:
            problems.append(f"call {i}: reasoning {read.reasoning!r}, wanted {turn.reasoning!r}")
        if read.content.strip() != turn.content:
            problems.append(f"call {i}: content {read.content!r}, wanted {turn.content!r}")
        wanted_calls = [(TOOL_NAME, ARGUMENTS)] if turn.calls_tool else []
        if read.calls != wanted_calls:
            problems.append(f"call {i}: tool calls {read.calls!r}, wanted {wanted_calls!r}")
    return problems


@dataclass
class Fidelity:
    """A record against its script: model tokens checked, drifted ones, the largest logprob difference."""

    tokens: int = 0
    drifted: int = 0
    max_logprob_diff: float = 0.0
    segments: int = 0

    def add(self, other: Fidelity) -> None:
        self.tokens += other.tokens
        self.drifted += other.drifted
        self.max_logprob_diff = max(self.max_logprob_diff, other.max_logprob_diff)
        self.segments += other.segments


def check_record(
    record: dict[str, Any], plan: Plan, tokenizer: Any, end_id: int, teacher: Callable[[list[int]], list[float]]
) -> Fidelity:
    """Every model span of the record against the script's ids (drift) and a teacher-forced recompute."""
    wanted = [[*tokenizer.encode(t.text, add_special_tokens=False), end_id] for t in plan.turns]
    spans = []
    result = Fidelity(segments=int(record["segments"]))
    for segment in record["segment_tokens"]:
        ids, logprobs = segment["token_ids"], segment["logprobs"]
        recomputed = teacher(ids)
        for kind, start, stop, *_ in segment["spans"]:
            if kind != "model":
                continue
            spans.append(ids[start:stop])
            for i in range(start, stop):
                result.tokens += 1
                result.max_logprob_diff = max(result.max_logprob_diff, abs(recomputed[i] - logprobs[i]))
    for got, want in zip(spans, wanted, strict=False):
        result.drifted += sum(a != b for a, b in zip(got, want, strict=False)) + abs(len(got) - len(want))
    result.drifted += sum(len(w) for w in wanted[len(spans) :])
    return result


def teacher_logprobs(model_dir: Any) -> Callable[[list[int]], list[float]]:
    """Teacher-forced logprobs of a whole sequence with a plain transformers forward pass (float32)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()  # type: ignore[no-untyped-call]

    def logprobs(token_ids: list[int]) -> list[float]:
        with torch.inference_mode():
            logits = model(torch.tensor([token_ids])).logits[0].float()
        picked = torch.log_softmax(logits, dim=-1)[torch.arange(len(token_ids) - 1), torch.tensor(token_ids[1:])]
        return [0.0, *picked.tolist()]

    return logprobs
