"""``farm.errors`` holds every exception that leaves its module, and its docstring draws them all.
Read from the source, so a module that is slow to import (torch, the proxy) counts too."""

from __future__ import annotations

import ast
import builtins
import inspect
import re
from pathlib import Path

import farm.errors

ROOT = Path(__file__).resolve().parents[2]
ERRORS = ROOT / "farm" / "errors.py"
#: shared exceptions that may live elsewhere: none.
KNOWN_ELSEWHERE: set[str] = set()
_BUILTIN_EXCEPTIONS = {
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)
}


def _sources() -> list[Path]:
    return sorted(p for top in ("farm", "tasks", "tests", "bench", "examples") for p in (ROOT / top).rglob("*.py"))


def _exception_classes(path: Path, bases: set[str]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            names = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
            if names & bases:
                found.append(node.name)
    return found


def _defined_elsewhere() -> dict[str, Path]:
    bases = _BUILTIN_EXCEPTIONS | {name for name, _ in inspect.getmembers(farm.errors, inspect.isclass)}
    paths = [path for path in _sources() if path != ERRORS and "tests" not in path.relative_to(ROOT).parts]
    found: dict[str, Path] = {}
    while True:  # until no new class: an exception may derive from one defined outside farm.errors
        more = {name: path for path in paths for name in _exception_classes(path, bases | set(found))}
        if more.keys() == found.keys():
            return found
        found = more


def test_errors_every_exception_leaving_its_module_is_in_farm_errors():
    defined = _defined_elsewhere()
    texts = {path: path.read_text() for path in _sources()}
    shared = sorted(
        f"{name} ({path.relative_to(ROOT)}) is named in {other.relative_to(ROOT)}"
        for name, path in defined.items()
        if name not in KNOWN_ELSEWHERE
        for other, text in texts.items()
        if other not in (path, ERRORS) and re.search(rf"\b{name}\b", text)
    )
    assert shared == []


def test_errors_the_docstring_draws_every_class():
    tree = farm.errors.__doc__ or ""
    classes = [
        name
        for name, cls in inspect.getmembers(farm.errors, inspect.isclass)
        if issubclass(cls, BaseException) and cls.__module__ == "farm.errors"
    ]
    assert [name for name in classes if not re.search(rf"\b{name}\b", tree)] == []
