"""The sympy side of answer checking. Runs only in a child process (see ``equivalence``).

``to_sympy_syntax`` rewrites the LaTeX a model writes (``\\frac``, ``\\sqrt``, ``\\cdot``,
``^``, ``\\pi``) into sympy's input syntax; ``equal_in_child`` parses both sides (implicit
multiplication allowed: ``2x``) and asks whether their difference simplifies to zero, with a
numeric spot check as a second opinion. Importing this module imports sympy, which is why the
forkserver preloads it.
"""

from __future__ import annotations

import re
import resource

import sympy
from sympy.parsing.sympy_parser import (
    convert_xor,
    implicit_multiplication_application,
    parse_expr,
    standard_transformations,
)

from tasks.math.vocabulary import LATEX_COMMANDS

#: address-space limit of the comparing child: sympy on hostile input can eat memory fast.
CHILD_ADDRESS_SPACE_BYTES = 2 * 1024**3
_TRANSFORMS = (*standard_transformations, implicit_multiplication_application, convert_xor)
_SAFE_GLOBALS: dict[str, object] = {
    "Integer": sympy.Integer,
    "Float": sympy.Float,
    "Rational": sympy.Rational,
    "Symbol": sympy.Symbol,
    "Function": sympy.Function,
    "sqrt": sympy.sqrt,
    "pi": sympy.pi,
    "E": sympy.E,
    "log": sympy.log,
    "ln": sympy.log,
    "sin": sympy.sin,
    "cos": sympy.cos,
    "tan": sympy.tan,
    "exp": sympy.exp,
    "oo": sympy.oo,
}


def _group(s: str, i: int) -> tuple[str, int]:
    """The argument starting at ``i``: a brace group, or a single character (``\\frac34``)."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        raise ValueError("missing argument")
    if s[i] != "{":
        return s[i], i + 1
    depth = 0
    for j in range(i, len(s)):
        depth += {"{": 1, "}": -1}.get(s[j], 0)
        if depth == 0:
            return s[i + 1 : j], j + 1
    raise ValueError("unbalanced braces")


def to_sympy_syntax(s: str) -> str:
    """Rewrite LaTeX-ish math into sympy input syntax.

    Raises:
        ValueError: unbalanced braces or a command without its argument.
    """
    out: list[str] = []
    i = 0
    while i < len(s):
        if s.startswith("\\frac", i):
            num, i = _group(s, i + 5)
            den, i = _group(s, i)
            out.append(f"(({to_sympy_syntax(num)})/({to_sympy_syntax(den)}))")
        elif s.startswith("\\sqrt", i):
            i += 5
            index = None
            if i < len(s) and s[i] == "[":
                close = s.index("]", i)
                index, i = s[i + 1 : close], close + 1
            arg, i = _group(s, i)
            inner = to_sympy_syntax(arg)
            out.append(f"(({inner})**(1/({to_sympy_syntax(index)})))" if index else f"sqrt({inner})")
        elif s[i] == "\\":
            match = re.match(r"\\[A-Za-z]+", s[i:])
            name = match.group(0) if match else s[i]
            out.append(f" {LATEX_COMMANDS.get(name, '')} ")
            i += len(name)
        elif s[i] in "{}":
            out.append("(" if s[i] == "{" else ")")
            i += 1
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def parse(s: str) -> sympy.Expr:
    text = to_sympy_syntax(s).replace("[", "(").replace("]", ")")
    return parse_expr(text, local_dict={}, global_dict=dict(_SAFE_GLOBALS), transformations=_TRANSFORMS)


def equal_in_child(a: str, b: str) -> tuple[bool, str]:
    """Compare two answers; meant to run in a throwaway process (it lowers its own memory limit)."""
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_ADDRESS_SPACE_BYTES, CHILD_ADDRESS_SPACE_BYTES))
    try:
        left, right = parse(a), parse(b)
    except Exception as exc:  # noqa: BLE001 - any parse failure of untrusted text is "not equal"
        return False, f"unparseable ({type(exc).__name__})"
    if isinstance(left, sympy.Eq) or isinstance(right, sympy.Eq):
        return False, "equations are not compared"
    try:
        if sympy.simplify(left - right) == 0:
            return True, "symbolic"
        # simplify can miss identities; equal values at a few points are a strong hint, not proof,
        # so only count them when the expressions have the same free symbols.
        symbols = sorted(left.free_symbols | right.free_symbols, key=str)
        if left.free_symbols != right.free_symbols:
            return False, "different variables"
        # Each symbol gets its own value: with one value for all, ``3x - y`` would pass for ``x + y``.
        points = [{s: 0.5 + k * 0.731 + i * 0.377 for i, s in enumerate(symbols)} for k in range(3)]
        diffs = [abs(complex((left - right).subs(point).evalf())) for point in points]
        return (all(d < 1e-9 for d in diffs)), "numeric spot check"
    except Exception as exc:  # noqa: BLE001 - sympy raises many types on odd input
        return False, f"not comparable ({type(exc).__name__})"
