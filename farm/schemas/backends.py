"""LLM inference servers as the API registers and lists them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from farm.schemas.stored import StoredStr, WholeInt


def _backend_url_pattern() -> str:
    """``http(s)://host[:port][/path]`` where host is a DNS name, an IPv4 address or a bracketed IPv6
    address (RFC 3986 forms), the port 1-65535, and the path plain or percent-encoded characters:
    exactly the URLs an HTTP client can parse, so a registered backend can always be probed."""
    h16 = "[0-9A-Fa-f]{1,4}"
    octet = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
    ipv4 = rf"{octet}(?:\.{octet}){{3}}"
    ls32 = rf"(?:{h16}:{h16}|{ipv4})"
    ipv6 = [rf"(?:{h16}:){{6}}{ls32}", rf"::(?:{h16}:){{5}}{ls32}"]
    tails = [rf"(?:{h16}:){{4}}{ls32}", rf"(?:{h16}:){{3}}{ls32}", rf"(?:{h16}:){{2}}{ls32}", rf"{h16}:{ls32}"]
    for k, tail in enumerate([*tails, ls32, h16, ""]):
        head = rf"(?:(?:{h16}:){{0,{k}}}{h16})?" if k else rf"(?:{h16})?"
        ipv6.append(rf"{head}::{tail}")
    label = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    # The last label starts with a letter, so a name is never mistaken for a malformed IPv4 address.
    hostname = rf"(?:{label}\.)*[A-Za-z](?:[A-Za-z0-9-]{{0,61}}[A-Za-z0-9])?"
    host = rf"(?:{hostname}|{ipv4}|\[(?:{'|'.join(ipv6)})\])"
    port = "(?::(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}))?"
    path = "(?:/(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})*)*"
    return f"^https?://{host}{port}{path}$"


#: the URLs ``POST /v1/backends`` accepts (see ``_backend_url_pattern``).
BACKEND_URL_PATTERN = _backend_url_pattern()
#: a backend id: letters, digits and ``._:@-``.
BACKEND_ID_PATTERN = r"^[A-Za-z0-9._:@-]+$"


class BackendCreate(BaseModel):
    """An LLM inference server to add to the balancer."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        pattern=BACKEND_ID_PATTERN,
        description="stable name; default: derived from the URL. Re-adding an id updates that backend in place",
    )
    url: str = Field(
        pattern=BACKEND_URL_PATTERN,
        max_length=2000,
        examples=["http://gpu0:8000"],
        description="http(s)://host[:port][/path]: a DNS name, IPv4 or [IPv6] address; no query or fragment",
    )
    kind: Literal["vllm", "sglang", "builtin"] = "vllm"
    model: StoredStr | None = Field(
        default=None, max_length=500, description="served model name, sent with each request"
    )
    capacity: WholeInt = Field(
        default=1, ge=1, le=100_000, description="relative weight: concurrent jobs it is sized for"
    )
    weight_version: WholeInt | None = Field(
        default=None,
        ge=0,
        le=2**31 - 1,
        description="the weights it serves; unset: 0 for a new backend, unchanged for a known one",
    )


class BackendOut(BaseModel):
    id: str
    url: str
    kind: str
    model: str | None
    capacity: int
    inflight: int
    healthy: bool
    weight_version: int
    context_tokens: int | None = Field(
        default=None, description="the served model's context length, as its /v1/models says (null: unknown)"
    )
    tokens_per_s: float | None = Field(
        default=None, description="tokens it sampled per second over the last minute (overview only)"
    )
