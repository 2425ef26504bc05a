"""A file editor for agents: view, create, str_replace, insert, undo_edit.

Runs inside the sandbox (in the execution server), so every path it can touch is a path
the sandbox can see. Relative paths resolve against the workspace. Bad edits (no match,
several matches, a missing file) come back as ``ToolResult.error``, never as exceptions.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from farm.tools.base import DEFAULT_OUTPUT_CAP_BYTES, ToolResult, truncate_text

#: edits remembered per file for undo_edit.
MAX_UNDO_DEPTH = 10
#: files larger than this are not loaded by view/str_replace.
MAX_FILE_BYTES = 10 * 1024 * 1024
COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")


class EditorError(Exception):
    """An edit the agent asked for cannot be done; reported as data."""


class Editor:
    """Stateful only through its undo history, kept per path for the sandbox's life."""

    def __init__(self, *, workspace: str, output_cap_bytes: int = DEFAULT_OUTPUT_CAP_BYTES) -> None:
        self._workspace = Path(workspace)
        self._cap = output_cap_bytes
        self._history: dict[Path, list[str | None]] = {}

    def run(
        self,
        command: str,
        path: str,
        *,
        file_text: str | None = None,
        old_str: str | None = None,
        new_str: str | None = None,
        insert_line: int | None = None,
        view_range: list[int] | None = None,
    ) -> ToolResult:
        try:
            target = self._resolve(path)
            if command == "view":
                text = self._view(target, view_range)
            elif command == "create":
                text = self._create(target, _required(file_text, "file_text"))
            elif command == "str_replace":
                text = self._str_replace(target, _required(old_str, "old_str"), new_str or "")
            elif command == "insert":
                if insert_line is None:
                    raise EditorError("insert_line is required for this command")
                text = self._insert(target, int(insert_line), _required(new_str, "new_str"))
            elif command == "undo_edit":
                text = self._undo(target)
            else:
                raise EditorError(f"unknown command {command!r}; use one of {', '.join(COMMANDS)}")
        except EditorError as exc:
            return ToolResult(exit_code=1, error=str(exc))
        except OSError as exc:
            return ToolResult(exit_code=1, error=f"{exc.strerror or exc}: {path}")
        output, truncated = truncate_text(text, cap_bytes=self._cap)
        return ToolResult(output=output, truncated=truncated)

    def _resolve(self, path: str) -> Path:
        if not path:
            raise EditorError("path is required")
        p = Path(path)
        return p if p.is_absolute() else self._workspace / p

    def _read(self, target: Path) -> str:
        if not target.exists():
            raise EditorError(f"no such file: {target}")
        if target.is_dir():
            raise EditorError(f"{target} is a directory")
        try:
            data = read_regular_file(target, max_bytes=MAX_FILE_BYTES)
        except ValueError as exc:
            raise EditorError(f"{exc}; use bash to inspect it") from exc
        return data.decode("utf-8", errors="replace")

    def _save(self, target: Path, text: str, *, previous: str | None) -> None:
        target.write_text(text, encoding="utf-8")
        stack = self._history.setdefault(target, [])
        stack.append(previous)
        del stack[:-MAX_UNDO_DEPTH]

    def _view(self, target: Path, view_range: list[int] | None) -> str:
        if target.is_dir():
            entries = []
            for root, dirs, files in os.walk(target):
                depth = Path(root).relative_to(target).parts
                dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if len(depth) < 1 else []
                entries += [str(Path(root, name).relative_to(target)) for name in sorted(files + dirs)]
            return "\n".join(entries) + ("\n" if entries else "")
        lines = self._read(target).split("\n")
        start, end = 1, len(lines)
        if view_range:
            if len(view_range) != 2:
                raise EditorError("view_range takes [start, end] (1-based, end -1 for the last line)")
            start, end = view_range[0], (len(lines) if view_range[1] == -1 else view_range[1])
            if not 1 <= start <= len(lines) or end < start or end > len(lines):
                raise EditorError(f"view_range {view_range} is outside the file's lines 1..{len(lines)}")
        width = len(str(end))
        return "".join(f"{n:>{width}}\t{lines[n - 1]}\n" for n in range(start, end + 1))

    def _create(self, target: Path, file_text: str) -> str:
        previous = self._read(target) if target.is_file() else None  # bounded: kept for undo_edit
        target.parent.mkdir(parents=True, exist_ok=True)
        self._save(target, file_text, previous=previous)
        return f"{'overwrote' if previous is not None else 'created'} {target}\n"

    def _str_replace(self, target: Path, old_str: str, new_str: str) -> str:
        text = self._read(target)
        count = text.count(old_str) if old_str else 0
        if count == 0:
            raise EditorError(f"old_str was not found in {target}; nothing was changed")
        if count > 1:
            lines = [i + 1 for i, line in enumerate(text.split("\n")) if old_str.split("\n")[0] in line]
            raise EditorError(
                f"old_str occurs {count} times in {target} (lines {lines[:10]}); add context to make it unique"
            )
        new_text = text.replace(old_str, new_str, 1)
        self._save(target, new_text, previous=text)
        first = text[: text.index(old_str)].count("\n") + 1
        return f"edited {target}:\n" + self._snippet(new_text, first, new_str.count("\n") + 1)

    def _insert(self, target: Path, insert_line: int, new_str: str) -> str:
        text = self._read(target)
        lines = text.split("\n")
        if not 0 <= insert_line <= len(lines):
            raise EditorError(f"insert_line {insert_line} is outside 0..{len(lines)}")
        new_lines = new_str.split("\n")
        new_text = "\n".join(lines[:insert_line] + new_lines + lines[insert_line:])
        self._save(target, new_text, previous=text)
        return f"inserted after line {insert_line} of {target}:\n" + self._snippet(
            new_text, insert_line + 1, len(new_lines)
        )

    def _undo(self, target: Path) -> str:
        stack = self._history.get(target)
        if not stack:
            raise EditorError(f"no edit to undo for {target}")
        previous = stack.pop()
        if previous is None:
            target.unlink(missing_ok=True)
            return f"undid the creation of {target}\n"
        target.write_text(previous, encoding="utf-8")
        return f"undid the last edit of {target}\n"

    @staticmethod
    def _snippet(text: str, first: int, count: int, context: int = 3) -> str:
        lines = text.split("\n")
        lo, hi = max(first - context, 1), min(first + count - 1 + context, len(lines))
        width = len(str(hi))
        return "".join(f"{n:>{width}}\t{lines[n - 1]}\n" for n in range(lo, hi + 1))


def read_regular_file(path: Path, *, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``, read in one bounded go.

    A FIFO, a device (``/dev/zero`` behind a planted symlink) or a file still growing would
    otherwise block the server or read without end.

    Raises:
        ValueError: not a regular file, or larger than ``max_bytes``.
        OSError: cannot be opened.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path} is not a regular file")
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path} is larger than {max_bytes} bytes")
    return data


def _required(value: str | None, name: str) -> str:
    if value is None:
        raise EditorError(f"{name} is required for this command")
    return value
