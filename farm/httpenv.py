"""HTTP helpers shared by the trainer's client and the farm's LLM layer (both stand on this layer).

The client's direct results pages (``farm.client.direct``) and the LLM backends' lean transport
(``farm.llm.transport``) each step aside for httpx where httpx would do something they do not:
``plain_http`` says when they need not.
"""

from __future__ import annotations

import urllib.request

import httpx


def plain_http(url: httpx.URL) -> bool:
    """Plain http that httpx would send straight to the server: no proxy from the environment
    (httpx honours ``HTTP_PROXY``/``ALL_PROXY``; a path of its own that does not steps aside)."""
    return url.scheme == "http" and not ({"http", "all"} & urllib.request.getproxies().keys())
