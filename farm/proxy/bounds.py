"""What a harness's request may cost before the proxy does its work: a body read with a limit and a
deadline, JSON read strictly, its shape bounded, and a prompt refused from its length in bytes.

A harness is untrusted code, and the proxy is its only door: every bound here is checked before
the work it bounds (reading, parsing, rendering, tokenizing), so no request, however built, makes
the process hold more than about ``BYTES_HELD_PER_BODY_BYTE`` times ``proxy.max_body_bytes`` (the
raw body, its text, the parsed objects, the rendered prompt) plus the ids of a prompt that fits
``proxy.max_prompt_tokens``.

A prompt's token count is at least its characters over the longest token's (no token stands for
more of the text than its own spelling's length): a prompt whose text holds more than
``NORMALIZING_SLACK * longest_token * max_prompt_tokens`` characters cannot fit, and is refused
without tokenizing it. The slack covers a tokenizer's normalizer, which may compose characters
(NFC composes three Hangul jamo into one syllable). Counted: the strings under ``PROMPT_FIELDS``
(a few, like a content block's ``type``, are not rendered: the slack covers them too). Longest
tokens: the tiny test model's 16 characters, Qwen3's and Llama 3's 128.

A prompt that passes that check may still hold far more than ``max_prompt_tokens`` (a 4 MB
message of the tiny model's: 4 M tokens): every text the proxy tokenizes is bounded by
``prompt_bound``, which counts a long one piece by piece and refuses it once past the limit
(``farm.llm.counting``), so the work before a refusal is bounded by the limit, not the text.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

from starlette.requests import Request

from farm.config import ProxySettings
from farm.errors import ProxyError
from farm.llm.counting import TokenBound

#: what a normalizer may shrink a text's bytes by, at most (see the module docstring).
NORMALIZING_SLACK = 4
#: the bytes a request's body may make the process hold, per byte of body (stated in docs/proxy.md).
BYTES_HELD_PER_BODY_BYTE = 8
#: the body fields a format renders into the prompt: their text counts towards the prompt's bytes.
PROMPT_FIELDS = ("messages", "input", "prompt", "system", "instructions", "tools")
#: the body fields holding the conversation's messages (chat and Anthropic, Responses).
MESSAGE_FIELDS = ("messages", "input")


async def read_body(request: Request, settings: ProxySettings) -> bytes:
    """The request's body, counted as it arrives (a chunked body too).

    Raises:
        ProxyError: 413 past ``max_body_bytes``; 408 when it takes longer than ``read_timeout_s``
            (a client trickling its bytes holds a socket and a buffer for nothing).
    """
    limit = settings.max_body_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)

    async def read() -> bytes:
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise _too_large(limit)
        return bytes(body)

    try:
        return await asyncio.wait_for(read(), settings.read_timeout_s)
    except TimeoutError:
        raise ProxyError(
            408, f"the request body was not sent within {settings.read_timeout_s} s", code="request_timeout"
        ) from None


def _too_large(limit: int) -> ProxyError:
    return ProxyError(
        413, f"the request body is larger than {limit} bytes (proxy.max_body_bytes)", code="body_too_large"
    )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is no JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text} is beyond a double (it reads as {value})")
    return value


def parse_json(raw: bytes, settings: ProxySettings) -> tuple[Any, int]:
    """The body as JSON checked against the proxy's bounds, and the bytes of its prompt's text.

    Raises:
        ProxyError: 400 naming the field: no UTF-8 (a raw surrogate, ``ED A0 80``, is none), no
            JSON (NaN, Infinity and numbers beyond a double are none), a lone surrogate in a
            string or key, nesting past ``max_json_depth``, more messages or tools than allowed.
    """
    try:
        text = raw.decode("utf-8")
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except UnicodeDecodeError as exc:
        raise ProxyError(400, f"the request body is not UTF-8 (at byte {exc.start}: {exc.reason})") from None
    except ValueError as exc:
        raise ProxyError(400, f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ProxyError(400, "the request body is nested too deep") from None
    del text
    if isinstance(value, dict):
        _check_counts(value, settings)
    return value, _check_tree(value, settings.max_json_depth)


def _check_counts(body: dict[str, Any], settings: ProxySettings) -> None:
    for field in MESSAGE_FIELDS:
        items = body.get(field)
        if isinstance(items, list) and len(items) > settings.max_messages:
            raise ProxyError(
                400, f"{field}: {len(items)} items, at most {settings.max_messages} (proxy.max_messages)", param=field
            )
    tools = body.get("tools")
    if isinstance(tools, list) and len(tools) > settings.max_tools:
        raise ProxyError(
            400, f"tools: {len(tools)} tools, at most {settings.max_tools} (proxy.max_tools)", param="tools"
        )


def _check_tree(body: Any, max_depth: int) -> int:
    """Check every string, key and nesting level of ``body`` (iteratively: no recursion to exhaust);
    the bytes of the text under ``PROMPT_FIELDS``."""
    prompt_bytes = 0
    stack: list[tuple[Any, str, int, bool]] = [(body, "", 0, False)]
    while stack:
        value, where, depth, in_prompt = stack.pop()
        if isinstance(value, str):
            if problem := _surrogate(value):
                raise ProxyError(400, f"{where or 'body'}: {problem}", param=where or None)
            if in_prompt:
                prompt_bytes += len(value)  # characters: a lower bound of its UTF-8 bytes, read without a copy
            continue
        if not isinstance(value, dict | list):
            continue
        if depth >= max_depth:
            raise ProxyError(
                400,
                f"{where or 'body'}: nested too deep (at most {max_depth} levels of objects and arrays)",
                param=where,
            )
        if isinstance(value, dict):
            for key, item in value.items():
                here = f"{where}.{key}" if where else key
                if problem := _surrogate(key):
                    raise ProxyError(400, f"{where or 'body'}: the key {key!r} {problem}", param=where or None)
                stack.append((item, here, depth + 1, in_prompt or (depth == 0 and key in PROMPT_FIELDS)))
        else:
            stack.extend((item, f"{where}.{i}", depth + 1, in_prompt) for i, item in enumerate(value))
    return prompt_bytes


def _surrogate(text: str) -> str | None:
    """Why ``text`` is no Unicode text (half of a UTF-16 surrogate pair, which no tokenizer, record
    or answer can hold), or None. A NUL is text: a model may write one, and its harness send it back."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"holds half of a UTF-16 surrogate pair ({text[exc.start]!r} at {exc.start}), which is no text"
    return None


def longest_token_bytes(tokenizer: Any) -> int:
    """The most characters of text any one token stands for, at most: its spelling's length (a
    byte-level spelling has a character per byte, at least one per character of text; a
    SentencePiece spelling has one per character, ``<0x41>`` six for one)."""
    return max((len(token) for token in tokenizer.get_vocab()), default=1)


def prompt_bound(longest_token: int, settings: ProxySettings) -> TokenBound:
    """What one text the proxy tokenizes may hold: ``max_prompt_tokens``, counted piece by piece
    before it is tokenized whole (``farm.llm.counting``); no token spans more than the longest
    token's characters, a normalizer's slack included."""
    return TokenBound(max_tokens=settings.max_prompt_tokens, reach=NORMALIZING_SLACK * longest_token)


def check_prompt_bytes(prompt_bytes: int, *, longest_token: int, max_prompt_tokens: int) -> None:
    """Refuse a prompt whose text cannot fit ``max_prompt_tokens`` tokens, before tokenizing it.

    Raises:
        ProxyError: 400 ``context_length_exceeded``.
    """
    bound = NORMALIZING_SLACK * longest_token * max_prompt_tokens
    if prompt_bytes > bound:
        raise ProxyError(
            400,
            f"the prompt's text ({prompt_bytes} characters) cannot fit the longest context served "
            f"({max_prompt_tokens} tokens, proxy.max_prompt_tokens): shorten the conversation",
            param="messages",
            code="context_length_exceeded",
        )
