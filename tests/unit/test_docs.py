"""The docs stay true to the code: every module is named in docs/layout.md, every setting is in
docs/operations.md with its default and environment name, and every relative link of the READMEs
and docs/ leads to a file (and heading) that exists.

``python tests/unit/test_docs.py`` prints the settings table as docs/operations.md holds it, from
``farm.config.Settings`` and the ``#:`` comments of farm/config.py.
"""

from __future__ import annotations

import ast
import json
import re
import socket
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from farm.config import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: shipped task data, not modules of the farm: a task's repository, a Harbor example.
TASK_DATA = [ROOT / "tasks" / "swe" / "instances", ROOT / "tasks" / "harbor" / "examples"]
#: ``[text](target)``, not inside backticks; an image link too.
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")


def _modules() -> list[str]:
    files = sorted((ROOT / "farm").rglob("*.py")) + sorted((ROOT / "tasks").rglob("*.py"))
    return [
        path.relative_to(ROOT).as_posix()
        for path in files
        if path.name != "__init__.py" and not any(path.is_relative_to(data) for data in TASK_DATA)
    ]


def test_layout_names_every_module():
    layout = (DOCS / "layout.md").read_text()
    named = set(re.findall(r"`([\w/.]+\.py)`", layout))
    missing = [module for module in _modules() if module not in named]
    assert not missing, f"docs/layout.md names no line for: {', '.join(missing)}"


def test_layout_names_no_module_that_is_gone():
    layout = (DOCS / "layout.md").read_text()
    gone = [name for name in re.findall(r"`((?:farm|tasks)/[\w/.]+\.py)`", layout) if not (ROOT / name).is_file()]
    assert not gone, f"docs/layout.md names modules that do not exist: {', '.join(gone)}"


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md")), *sorted(ROOT.glob("*/README.md"))]


def _links(text: str) -> Iterator[str]:
    # Code spans and fenced blocks hold examples, not links.
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "", text)
    for match in LINK.finditer(text):
        yield match.group(1)


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lowercase, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    anchors = set()
    for line in path.read_text().splitlines():
        if heading := re.match(r"#{1,6} (.+)", line):
            anchors.add(re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-"))
    return anchors


def test_relative_links_lead_to_files_and_headings_that_exist():
    broken = []
    for doc in _markdown_files():
        for target in _links(doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            name, _, anchor = target.partition("#")
            path = (doc.parent / name).resolve() if name else doc
            if not path.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


# -- the settings table --------------------------------------------------------------------------


def _comments() -> dict[tuple[str, str], str]:
    """The ``#:`` comment above each field of farm/config.py, by (class, field)."""
    source = (ROOT / "farm" / "config.py").read_text()
    lines = source.splitlines()
    found: dict[tuple[str, str], str] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                above: list[str] = []
                n = item.lineno - 2
                while n >= 0 and lines[n].strip().startswith("#:"):
                    above.insert(0, lines[n].strip()[2:].strip())
                    n -= 1
                found[(node.name, item.target.id)] = " ".join(above)
    return found


def _default(field: FieldInfo) -> str:
    """A field's default as an environment variable would spell it."""
    if field.default_factory is socket.gethostname:
        return "the host name"
    value: Any = field.get_default(call_default_factory=True)
    if value is None or value is PydanticUndefined:
        return "unset"
    if isinstance(value, SecretStr):
        return "set"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Path):
        home = str(Path.home())
        text = str(value)
        return "~" + text[len(home) :] if text.startswith(home + "/") else text
    if isinstance(value, list):
        return json.dumps(value)
    return str(value)


def settings_rows() -> Iterator[tuple[str, str, str, str]]:
    """(environment variable, dotted name, default, comment) for every leaf of ``Settings``."""
    comments = _comments()

    def walk(model: type[BaseModel], env: str, dotted: str) -> Iterator[tuple[str, str, str, str]]:
        for name, field in model.model_fields.items():
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                yield from walk(annotation, f"{env}{name.upper()}__", f"{dotted}{name}.")
            else:
                comment = comments.get((model.__name__, name), "")
                yield f"{env}{name.upper()}", f"{dotted}{name}", _default(field), comment

    yield from walk(Settings, "FARM_", "")


def settings_table() -> str:
    rows = ["| environment variable | setting | default | what |", "| --- | --- | --- | --- |"]
    for env, dotted, default, comment in settings_rows():
        rows.append(f"| `{env}` | `{dotted}` | `{default}` | {comment} |")
    return "\n".join(rows)


def _documented_settings() -> dict[str, tuple[str, str]]:
    """(setting, default) by environment variable, from the table of docs/operations.md's Settings."""
    text = (DOCS / "operations.md").read_text()
    section = re.search(r"^## Settings\n(.*?)(?=^## |\Z)", text, flags=re.MULTILINE | re.DOTALL)
    assert section, "docs/operations.md has no '## Settings' section"
    rows = {}
    for line in section.group(1).splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and re.fullmatch(r"`FARM_[A-Z0-9_]+`", cells[0]):
            rows[cells[0].strip("`")] = (cells[1].strip("`"), cells[2].strip("`"))
    return rows


def test_operations_lists_every_setting_with_its_default():
    documented = _documented_settings()
    wrong = []
    for env, dotted, default, _ in settings_rows():
        if env not in documented:
            wrong.append(f"{env} ({dotted}) is missing")
        elif documented[env] != (dotted, default):
            wrong.append(f"{env}: the table says {documented[env]}, Settings says {(dotted, default)}")
    assert not wrong, "docs/operations.md's settings table (python tests/unit/test_docs.py prints it):\n" + "\n".join(
        wrong
    )


def test_operations_lists_no_setting_that_is_gone():
    known = {env for env, *_ in settings_rows()}
    gone = sorted(set(_documented_settings()) - known)
    assert not gone, f"docs/operations.md lists settings Settings does not have: {', '.join(gone)}"


if __name__ == "__main__":
    print(settings_table())
