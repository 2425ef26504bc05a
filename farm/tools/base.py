"""What every tool returns, and the bounded output buffer they share.

This module runs inside the sandbox too (the execution server imports it), so it stays
stdlib-only: no pydantic, nothing that slows the server's start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: per-call timeout when the caller gives none; distinct from the episode budget.
DEFAULT_TOOL_TIMEOUT_S = 60.0
#: bytes of output a call keeps: half from the head, half from the tail.
DEFAULT_OUTPUT_CAP_BYTES = 16 * 1024
#: what stands where the middle of a long output was cut.
TRUNCATION_MARKER = "\n[... {omitted} bytes of output omitted ...]\n"


@dataclass
class ToolResult:
    """The outcome of one tool call, always data: a failing command is not an exception.

    ``exit_code`` is the command's status (bash, exec), 0/1 for ipython and editor;
    ``None`` when the call did not finish (timeout) or never ran.
    """

    output: str = ""
    exit_code: int | None = 0
    timed_out: bool = False
    error: str | None = None
    truncated: bool = False
    #: tool-specific extras, e.g. ``{"shell_restarted": True}`` or ``{"oom_killed": True}``.
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and self.error is None

    def to_dict(self) -> dict[str, Any]:
        # By hand: dataclasses.asdict deep-copies and costs more than the rest of a bash call.
        return {
            "output": self.output,
            "exit_code": self.exit_code,
            "timed_out": self.timed_out,
            "error": self.error,
            "truncated": self.truncated,
            "info": self.info,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolResult:
        return cls(
            output=str(data.get("output", "")),
            exit_code=data.get("exit_code"),
            timed_out=bool(data.get("timed_out", False)),
            error=data.get("error"),
            truncated=bool(data.get("truncated", False)),
            info=dict(data.get("info") or {}),
        )

    def to_observation(self) -> str:
        """The text an agent loop shows the model for this call."""
        parts = [self.output] if self.output else []
        if self.timed_out:
            parts.append("[command timed out and was interrupted]")
        if self.error:
            parts.append(f"[error] {self.error}")
        if self.exit_code not in (0, None):
            parts.append(f"[exit code {self.exit_code}]")
        return "\n".join(parts)


class OutputBuffer:
    """Keeps the head and the tail of a stream and counts what was dropped in between.

    Memory stays bounded whatever a command prints (``yes`` until the timeout), and the
    tail, where errors and summaries usually are, survives. ``limit_bytes`` is the budget a
    tool checks (``over_limit``) to stop a command that prints without end.
    """

    def __init__(self, *, cap_bytes: int = DEFAULT_OUTPUT_CAP_BYTES, limit_bytes: int | None = None) -> None:
        self._half = max(cap_bytes // 2, 1)
        self._head = bytearray()
        self._tail = bytearray()
        self._head_closed = False
        self.limit = limit_bytes or None
        self.total = 0

    @property
    def over_limit(self) -> bool:
        return self.limit is not None and self.total > self.limit

    def write(self, data: bytes) -> None:
        self.total += len(data)
        room = 0 if self._head_closed else self._half - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail += data
            if len(self._tail) > 2 * self._half:
                del self._tail[: len(self._tail) - self._half]

    def skip(self, nbytes: int) -> None:
        """Count ``nbytes`` a producer dropped before they got here (the IPython kernel's own cut)."""
        if nbytes <= 0:
            return
        self.total += nbytes
        self._head_closed = True
        self._tail.clear()  # what follows is not contiguous with it: counted as omitted instead

    def render(self) -> tuple[str, bool]:
        """Returns (text, truncated)."""
        tail = self._tail[-self._half :] if len(self._tail) > self._half else self._tail
        omitted = self.total - len(self._head) - len(tail)
        if omitted <= 0:
            return (bytes(self._head) + bytes(self._tail)).decode("utf-8", "replace"), False
        text = (
            bytes(self._head).decode("utf-8", "replace")
            + TRUNCATION_MARKER.format(omitted=omitted)
            + bytes(tail).decode("utf-8", "replace")
        )
        return text, True

    def annotate(self, info: dict[str, Any]) -> None:
        """Adds ``output_bytes`` (all that was printed) and ``omitted_bytes`` to a cut result's info."""
        kept = len(self._head) + min(len(self._tail), self._half)
        if self.total > kept:
            info["output_bytes"] = self.total
            info["omitted_bytes"] = self.total - kept


def output_limit_error(limit: int | None) -> str:
    return f"the output passed the limit of {limit} bytes: the command was stopped"


def truncate_text(text: str, *, cap_bytes: int = DEFAULT_OUTPUT_CAP_BYTES) -> tuple[str, bool]:
    """Head and tail of ``text`` within ``cap_bytes``; returns (text, truncated)."""
    buf = OutputBuffer(cap_bytes=cap_bytes)
    buf.write(text.encode("utf-8", "replace"))
    return buf.render()
