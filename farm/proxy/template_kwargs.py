"""A request's chat-template kwargs: the per-request thinking switch of each format, checked and bounded.

- Chat Completions: ``chat_template_kwargs`` (as vLLM accepts it), e.g. ``{"enable_thinking": false}``.
- Anthropic Messages: ``thinking``: ``{"type": "enabled", "budget_tokens": N}`` and ``{"type":
  "adaptive"}`` (Claude 4.6 and later) are ``enable_thinking: true``, ``{"type": "disabled"}`` is
  ``enable_thinking: false`` (the budget is checked as Anthropic checks it, at least 1024 and below
  ``max_tokens``; ``max_tokens`` bounds the answer, reasoning included).
- Responses: ``reasoning.effort``: ``"none"`` is ``enable_thinking: false``, any other effort
  (``minimal`` to ``xhigh``) ``true``; no effort leaves the template's default.

The kwargs reach the chat template (``Renderer``) and so the prompt; a template that then closes the
think block in its generation prompt (Qwen3) has its answer read as content by the reasoning parser
(``farm.proxy.reasoning_formats.prompt_ends_reasoning``). They are part of the conversation's hash
chain (``farm.proxy.conversation.chain``): a call with other kwargs is another prompt, never the
continuation of one rendered without them. A harness may pass any kwargs a template reads, within
bounds that keep the cost of a request small: flat values (no lists or objects), few and short.
"""

from __future__ import annotations

import re
from typing import Any

from farm.errors import ProxyError

#: at most this many kwargs, each name and each string value at most these many characters.
MAX_KWARGS = 16
MAX_NAME_CHARS = 64
MAX_STRING_CHARS = 256
#: what a template is called with by the proxy itself: a kwarg must not replace them.
RESERVED = frozenset(
    {
        "messages",
        "conversation",
        "tools",
        "tokenize",
        "add_generation_prompt",
        "continue_final_message",
        "chat_template",
        "documents",
        "return_dict",
        "return_tensors",
        "tokenizer_kwargs",
        "padding",
        "truncation",
    }
)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
ANTHROPIC_MIN_BUDGET = 1024
RESPONSES_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def check(value: Any, *, param: str = "chat_template_kwargs") -> dict[str, Any]:
    """``value`` as template kwargs.

    Raises:
        ProxyError: 400 naming the kwarg and what is wrong (not an object, a name that is no
            identifier or is reserved, a value that is not a string, number, boolean or null, too many,
            too long).
    """
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProxyError(400, f"{param} must be an object of template variables", param=param)
    if len(value) > MAX_KWARGS:
        raise ProxyError(400, f"{param} has {len(value)} entries; at most {MAX_KWARGS}", param=param)
    for name, item in value.items():
        where = f"{param}.{name}"
        if not isinstance(name, str) or len(name) > MAX_NAME_CHARS or not _NAME.match(name):
            raise ProxyError(
                400,
                f"{param}: {name!r} is not a template variable name (an identifier of at most {MAX_NAME_CHARS})",
                param=param,
            )
        if name in RESERVED:
            raise ProxyError(400, f"{where} is set by the proxy itself and cannot be passed", param=where)
        if isinstance(item, str):
            if len(item) > MAX_STRING_CHARS:
                raise ProxyError(400, f"{where} is longer than {MAX_STRING_CHARS} characters", param=where)
        elif item is not None and not isinstance(item, (bool, int, float)):
            raise ProxyError(
                400, f"{where} must be a string, number, boolean or null, not {type(item).__name__}", param=where
            )
    return dict(value)


def from_anthropic_thinking(value: Any, *, max_tokens: int) -> dict[str, Any]:
    """Anthropic's ``thinking`` as template kwargs.

    Raises:
        ProxyError: 400 in Anthropic's words (``thinking.type``, ``thinking.budget_tokens``).
    """
    if value is None:
        return {}
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "disabled":
        return {"enable_thinking": False}
    if kind == "adaptive":
        # Claude 4.6 and later (what Claude Code sends): the model decides how much to think; no budget.
        return {"enable_thinking": True}
    if kind != "enabled":
        raise ProxyError(400, "thinking.type: must be 'enabled', 'adaptive' or 'disabled'", param="thinking.type")
    budget = value.get("budget_tokens")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < ANTHROPIC_MIN_BUDGET:
        raise ProxyError(
            400,
            f"thinking.enabled.budget_tokens: must be an integer >= {ANTHROPIC_MIN_BUDGET}",
            param="thinking.budget_tokens",
        )
    if budget >= max_tokens:
        raise ProxyError(
            400, "`max_tokens` must be greater than `thinking.budget_tokens`", param="thinking.budget_tokens"
        )
    return {"enable_thinking": True}


def from_responses_reasoning(value: Any) -> dict[str, Any]:
    """The Responses ``reasoning`` parameter as template kwargs.

    Raises:
        ProxyError: 400: not an object, or an effort OpenAI does not name.
    """
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProxyError(400, "reasoning must be an object ({'effort': ...})", param="reasoning")
    effort = value.get("effort")
    if effort is None:
        return {}
    if effort not in RESPONSES_EFFORTS:
        raise ProxyError(
            400, f"reasoning.effort {effort!r} is not one of {', '.join(RESPONSES_EFFORTS)}", param="reasoning.effort"
        )
    return {"enable_thinking": effort != "none"}
