"""The layers docs/layout.md draws: imports only run downwards, and the trainer's client
stands on the shared models alone. Read from the source, so a lazy import inside a function
counts too."""

from __future__ import annotations

import ast
from pathlib import Path

FARM = Path(__file__).resolve().parents[2] / "farm"

#: lowest first; a module may import its own layer and the ones below.
LAYERS: list[set[str]] = [
    # ``farm`` itself: its __init__ holds only the version. ``farm.httpenv``: what the client and llm share.
    {
        "farm",
        "farm.__version__",
        "farm.config",
        "farm.schemas",
        "farm.constants",
        "farm.errors",
        "farm.httpenv",
        "farm.periodic",
    },
    {
        "farm.db",
        "farm.llm",
        "farm.sandbox",
        "farm.tools",
        "farm.handlers",
        "farm.agent",
        "farm.client",
        "farm.testing",
        "farm.proxy",
        "farm.trials",
        "farm.dynamic",
        "farm.bridges",
        "farm.learning",
        "farm.metrics",
        "farm.signals",
    },
    # A concept's logic over storage, the LLM layer and the handlers: the API calls it; it reaches
    # neither the API nor the workers (a batch's INIT is sent through the function it is given).
    {"farm.weights", "farm.batches", "farm.deadlines"},
    {"farm.api", "farm.worker"},
    {"farm.cli", "farm.embedded", "farm.demo", "farm.progress", "farm.report", "farm.status_view", "farm.__main__"},
]


def _layer(module: str) -> int:
    top = ".".join(module.split(".")[:2])
    for index, layer in enumerate(LAYERS):
        if top in layer:
            return index
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS")


def _imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "farm":
            found += [f"farm.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return [name for name in found if name == "farm" or name.startswith("farm.")]


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(FARM.rglob("*.py")):
        parts = path.relative_to(FARM.parent).with_suffix("").parts
        out.append((".".join(parts[:-1] if parts[-1] == "__init__" else parts), path))
    return out


def test_imports_only_run_down_the_layers():
    upward = [
        f"{module} imports {name}"
        for module, path in _modules()
        for name in _imports(path)
        if _layer(name) > _layer(module)
    ]
    assert upward == []


def test_the_client_needs_only_the_shared_models():
    allowed = {"farm.client", "farm.schemas", "farm.errors", "farm.constants", "farm.httpenv"}
    extra = [
        f"{module} imports {name}"
        for module, path in _modules()
        if module.startswith("farm.client")
        for name in _imports(path)
        if ".".join(name.split(".")[:2]) not in allowed
    ]
    assert extra == []
