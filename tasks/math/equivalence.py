"""Is a normalised answer equal to the reference? Exact numbers first, sympy only when needed.

Numbers (integers, decimals, ``a/b``, ``\\frac{a}{b}``) compare as exact fractions in this
process: cheap and safe. Anything else (``2x+3``, ``5\\sqrt{2}``, ``3\\pi``) goes through sympy,
which is not safe on untrusted input: ``9^9^9^9`` never finishes and ``parse_expr`` uses
``eval``. So the symbolic path (1) accepts only a whitelist of characters and names, and
(2) runs in a child process from a ``forkserver`` that has sympy preloaded (a fork costs a few
milliseconds, not an import), with a wall-clock timeout and an address-space limit.
A child cannot be started from a daemonic process (e.g. a prefork pool child); farm's worker
pools are threads, where this works.
"""

from __future__ import annotations

import multiprocessing
import re
from fractions import Fraction
from typing import Any

from tasks.math.vocabulary import LATEX_COMMANDS, PLAIN_NAMES

#: default limit on one symbolic comparison (parse + simplify of both sides).
DEFAULT_SYMBOLIC_TIMEOUT_S = 5.0
#: longest expression handed to sympy.
MAX_SYMBOLIC_CHARS = 200
#: integers and decimals longer than this are not compared (Fraction of a huge string is slow).
MAX_NUMBER_DIGITS = 60

_CTX = multiprocessing.get_context("forkserver")
_NUM = r"-?(?:\d+(?:\.\d*)?|\.\d+)"
_PLAIN = re.compile(rf"^({_NUM})$")
_SLASH = re.compile(rf"^({_NUM})\s*/\s*({_NUM})$")
_FRAC = re.compile(rf"^(-?)\\frac\s*(?:\{{\s*({_NUM})\s*\}}|(\d))\s*(?:\{{\s*({_NUM})\s*\}}|(\d))$")
_ALLOWED_CHARS = re.compile(r"^[0-9A-Za-z+\-*/^().,\s\\{}\[\]=]*$")


def as_fraction(s: str) -> Fraction | None:
    """The exact value of a plain number, ``a/b`` or ``\\frac{a}{b}``; None for anything else."""
    s = s.strip().strip("()").strip()
    if len(s) > MAX_NUMBER_DIGITS:
        return None
    try:
        if m := _PLAIN.match(s):
            return Fraction(m.group(1))
        if m := _SLASH.match(s):
            return Fraction(m.group(1)) / Fraction(m.group(2))
        if m := _FRAC.match(s):
            num = Fraction(m.group(2) or m.group(3)) / Fraction(m.group(4) or m.group(5))
            return -num if m.group(1) else num
    except (ValueError, ZeroDivisionError):
        return None
    return None


def _split_list(s: str) -> list[str]:
    """Top-level items of ``(a, b)``, ``[a, b]`` or ``a, b``; a single item otherwise."""
    inner = s[1:-1] if len(s) > 1 and s[0] in "([" and s[-1] in ")]" else s
    depth = 0
    items: list[str] = []
    current: list[str] = []
    for ch in inner:
        depth += ch in "({["
        depth -= ch in ")}]"
        if ch == "," and depth == 0:
            items.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    items.append("".join(current).strip())
    return items if len(items) > 1 else [s]


def symbolic_allowed(s: str) -> bool:
    """Whether ``s`` may be handed to sympy at all (length, characters, known names only)."""
    if len(s) > MAX_SYMBOLIC_CHARS or not _ALLOWED_CHARS.match(s):
        return False
    names = re.findall(r"\\?[A-Za-z]{2,}", s)
    return all(name in LATEX_COMMANDS or name in PLAIN_NAMES for name in names)


def _child(a: str, b: str, conn: Any) -> None:
    from tasks.math import symbolic  # sympy is heavy: only the forkserver and its children import it

    conn.send(symbolic.equal_in_child(a, b))
    conn.close()


def symbolic_equal(a: str, b: str, *, timeout_s: float = DEFAULT_SYMBOLIC_TIMEOUT_S) -> tuple[bool, str]:
    """Compare two expressions with sympy in a child process; (equal, why)."""
    if not (symbolic_allowed(a) and symbolic_allowed(b)):
        return False, "not a safe expression"
    _CTX.set_forkserver_preload(["tasks.math.symbolic"])
    receiver, sender = _CTX.Pipe(duplex=False)
    proc = _CTX.Process(target=_child, args=(a, b, sender), daemon=True)
    try:
        proc.start()
        sender.close()
        if not receiver.poll(timeout_s):
            return False, "symbolic comparison timed out"
        result = receiver.recv()
    except EOFError:
        return False, "symbolic comparison crashed"
    finally:
        receiver.close()
        proc.kill()
        proc.join()
        proc.close()
    equal, why = result
    return bool(equal), str(why)


def equivalent(answer: str, reference: str, *, timeout_s: float = DEFAULT_SYMBOLIC_TIMEOUT_S) -> tuple[bool, str]:
    """Whether two normalised answers have the same value; (equal, how it was decided)."""
    if answer == reference:
        return True, "identical"
    ref_items, ans_items = _split_list(reference), _split_list(answer)
    if len(ref_items) > 1 or len(ans_items) > 1:
        if len(ref_items) != len(ans_items):
            return False, f"expected {len(ref_items)} items, got {len(ans_items)}"
        for got, want in zip(ans_items, ref_items, strict=True):
            ok, why = equivalent(got, want, timeout_s=timeout_s)
            if not ok:
                return False, f"item {got!r}: {why}"
        return True, "all items equal"
    want_num, got_num = as_fraction(reference), as_fraction(answer)
    if want_num is not None and got_num is not None:
        return (got_num == want_num), "numeric"
    return symbolic_equal(answer, reference, timeout_s=timeout_s)
