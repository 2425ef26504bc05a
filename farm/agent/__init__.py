"""The built-in agent loop's pieces that need neither a sandbox nor an LLM: the tool-call text format."""

from __future__ import annotations

from farm.agent.toolcalls import (
    ParsedTurn,
    ToolCall,
    ToolCallError,
    check_arguments,
    errors_text,
    format_call,
    format_errors,
    format_response,
    parse_tool_calls,
)

__all__ = [
    "ParsedTurn",
    "ToolCall",
    "ToolCallError",
    "check_arguments",
    "errors_text",
    "format_call",
    "format_errors",
    "format_response",
    "parse_tool_calls",
]
