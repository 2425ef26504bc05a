"""The names an answer may use: LaTeX commands and plain function names, shared by the cheap
checks (``equivalence``) and the sympy parser (``symbolic``) without either importing the other."""

from __future__ import annotations

#: LaTeX commands a model may use in an answer, and their sympy spelling. Everything else is
#: refused before parsing, since parse_expr evaluates its input as Python.
LATEX_COMMANDS: dict[str, str] = {
    "\\frac": "",
    "\\sqrt": "",
    "\\pi": "pi",
    "\\cdot": "*",
    "\\times": "*",
    "\\div": "/",
    "\\ln": "log",
    "\\log": "log",
    "\\sin": "sin",
    "\\cos": "cos",
    "\\tan": "tan",
    "\\exp": "exp",
    "\\infty": "oo",
}
#: plain names (no backslash) a model may use.
PLAIN_NAMES = frozenset({"sqrt", "pi", "log", "ln", "sin", "cos", "tan", "exp", "oo"})
