"""Read and rewrite the UPPERCASE constants ("knobs") of a training script.

A knob is a module-level assignment `NAME = value` (or `NAME: type = value`) whose name is
UPPERCASE and whose value is a literal or constant arithmetic (`2**17`, `3 * 1024`, `-1e-3`,
`(1, 2)`, `'SSSL'`). These are what `nightlab submit --set NAME=VALUE` and the search
strategies change.

Rewriting splices text instead of regenerating code: `ast` gives the byte span of the value
expression and only those bytes are replaced, so comments, spacing, line endings (LF, CRLF,
CR) and every other line stay byte-for-byte identical, and the diff of a variant is exactly
the changed value. `ast` column offsets are UTF-8 byte offsets, so spans are computed on the
encoded source; lines with non-ASCII text before the value are handled.

A name bound twice at module level follows Python: the last binding wins. If the last binding
is a literal assignment, that one is the knob and the one `set_knobs` rewrites (earlier ones
are dead code). If anything later rebinds the name in a way that is not a literal assignment
(`LR *= 2`, `LR = BASE_LR * 2`, an assignment inside a top-level `if`), the name is not a
knob: rewriting an earlier line would not change what the script runs with.

Usage:
    knobs = list_knobs(path.read_text())
    new_text = set_knobs(path.read_text(), {"MATRIX_LR": "0.02", "TOTAL_BATCH_SIZE": "2**17"})
"""

from __future__ import annotations

import ast
import math
import operator
import re
from dataclasses import dataclass

from nightlab.errors import UsageError, closest_first, did_you_mean

__all__ = ["Knob", "list_knobs", "mismatch", "parse_value", "set_knobs"]

_NAME = re.compile(r"[A-Z][A-Z0-9_]*\Z")
_NEWLINE = re.compile(rb"\r\n|\r|\n")

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
# No hyperparameter needs more than a few hundred bits; the cap keeps a hostile `10**10**9` from
# hanging the CLI.
_MAX_POWER_BITS = 65536


@dataclass(frozen=True)
class Knob:
    """One UPPERCASE constant of a script.

    Attributes:
        name: the constant's name.
        source: the value's source text exactly as written (`"2**17"`, `"'SSSL'"`).
        value: the evaluated value.
        type: `int`, `float`, `str`, `bool`, `tuple`, `list` or `none` after the evaluated value;
            `expr` for other literal kinds (dict, set, bytes, complex).
        line: 1-based line where the value starts.
    """

    name: str
    source: str
    value: object
    type: str
    line: int


class _NotConstant(Exception):
    """The expression is not a literal or constant arithmetic."""


def _evaluate(node: ast.AST) -> object:
    """Evaluate a literal or constant-arithmetic expression, refusing everything else."""
    if isinstance(node, ast.Constant):
        if node.value is Ellipsis:
            raise _NotConstant
        return node.value
    if isinstance(node, ast.Tuple):
        return tuple(_evaluate(e) for e in node.elts)
    if isinstance(node, ast.List):
        return [_evaluate(e) for e in node.elts]
    if isinstance(node, (ast.Set, ast.Dict)):
        if isinstance(node, ast.Dict) and any(k is None for k in node.keys):  # `{**x}`
            raise _NotConstant
        try:  # `{[1]: 2}` has an unhashable key
            if isinstance(node, ast.Set):
                return {_evaluate(e) for e in node.elts}
            return {_evaluate(k): _evaluate(v) for k, v in zip(node.keys, node.values, strict=True)}
        except TypeError as e:
            raise _NotConstant from e
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        operand = _number(_evaluate(node.operand))
        return operand if isinstance(node.op, ast.UAdd) else -operand
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _number(_evaluate(node.left)), _number(_evaluate(node.right))
        if isinstance(node.op, ast.Pow) and not _small_power(left, right):
            raise _NotConstant
        try:
            return _BINOPS[type(node.op)](left, right)
        except (ArithmeticError, ValueError) as e:  # 1/0, float overflow
            raise _NotConstant from e
    raise _NotConstant


def _small_power(base: object, exponent: object) -> bool:
    if not isinstance(exponent, (int, float)) or abs(exponent) > _MAX_POWER_BITS:
        return False
    if isinstance(base, int) and isinstance(exponent, int):
        return abs(base).bit_length() * abs(exponent) <= _MAX_POWER_BITS
    return True


def _number(value: object) -> int | float | complex:
    # bool is an int subclass; `True + 1` is not a hyperparameter anyone means.
    if isinstance(value, bool) or not isinstance(value, (int, float, complex)):
        raise _NotConstant
    return value


def _type_name(value: object) -> str:
    if value is None:
        return "none"
    for kind in (bool, int, float, str, tuple, list):  # bool before int: bool is an int
        if isinstance(value, kind):
            return kind.__name__
    return "expr"


def parse_value(text: str) -> object:
    """Evaluate a knob value given as Python source text.

    Args:
        text: a literal or constant arithmetic expression on one line, e.g. `0.02`, `2**16`,
            `'L'`, `True`, `(1, 2)`.

    Returns:
        The evaluated value.

    Raises:
        UsageError: the text is not a literal or constant expression.
    """
    if "\n" in text or "\r" in text:
        raise UsageError(f"knob value `{text!r}` spans several lines; give it on one line")
    try:
        tree = ast.parse(text.strip(), mode="eval")
        value = _evaluate(tree.body)
    # ValueError: a NUL byte; MemoryError / RecursionError: 100k nested `-` or `(` (found by tests/reliability)
    except (SyntaxError, ValueError, MemoryError, RecursionError, _NotConstant):
        raise UsageError(
            f"knob value `{text[:80]}` is not a Python literal or constant expression; "
            "use e.g. 0.02, 2**16, 'L', True or (1, 2) (quote strings)"
        ) from None
    if isinstance(value, float) and not math.isfinite(value):  # `1e309` reads as inf
        raise UsageError(f"knob value `{text[:80]}` is not a finite number; give a finite value, e.g. 0.02")
    return value


@dataclass(frozen=True)
class _Site:
    knob: Knob
    start: int  # byte offsets of the value expression in the UTF-8 source
    end: int


def _line_starts(data: bytes) -> list[int]:
    """Byte offset where each line starts, splitting as Python's tokenizer does."""
    return [0] + [m.end() for m in _NEWLINE.finditer(data)]


def _stored_names(stmt: ast.stmt) -> set[str]:
    """Names a module-level statement binds at module scope (function and class bodies excluded)."""
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            return
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(stmt)
    return names


def _literal_assignment(stmt: ast.stmt) -> tuple[str, ast.expr] | None:
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id, stmt.value
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
        return stmt.target.id, stmt.value
    return None


def _sites(source: str) -> dict[str, _Site]:
    # Python runs files that start with a UTF-8 byte order mark; ast.parse of a str refuses it.
    bom = "\ufeff" if source.startswith("\ufeff") else ""
    body = source[len(bom) :]
    try:
        tree = ast.parse(body)
    except SyntaxError as e:
        raise UsageError(
            f"cannot parse the script: line {e.lineno}: `{e.msg}`; fix the syntax error"
        ) from None
    data = source.encode("utf-8")
    shift = len(bom.encode("utf-8"))
    starts = [shift + s for s in _line_starts(body.encode("utf-8"))]
    sites: dict[str, _Site] = {}
    for stmt in tree.body:
        assignment = _literal_assignment(stmt)
        if assignment is not None and _NAME.match(assignment[0]):
            name, node = assignment
            try:
                value = _evaluate(node)
            except _NotConstant:
                sites.pop(name, None)
                continue
            start = starts[node.lineno - 1] + node.col_offset
            end = starts[node.end_lineno - 1] + node.end_col_offset
            text = data[start:end].decode("utf-8")
            sites.pop(name, None)  # re-insert so the order is that of the effective definitions
            sites[name] = _Site(Knob(name, text, value, _type_name(value), node.lineno), start, end)
        elif not (isinstance(stmt, ast.AnnAssign) and stmt.value is None):  # `X: int` binds nothing
            for name in _stored_names(stmt):
                sites.pop(name, None)
    return sites


def list_knobs(source: str) -> list[Knob]:
    """The knobs of a script, in the order of their (effective) definitions.

    Raises:
        UsageError: the source is not valid Python.
    """
    return [site.knob for site in _sites(source).values()]


def _unknown(name: str, known: list[str]) -> UsageError:
    listing = ", ".join(closest_first(name, known)) or "none (no UPPERCASE literal constants at module level)"
    return UsageError(f"unknown knob `{name}`; {did_you_mean(name, known)}known knobs: {listing}")


def _kind(value: object) -> str:
    return "none" if value is None else type(value).__name__


def _fits(current: object, value: object) -> bool:
    if value is None:
        return True  # as in a sweep's list: None is how scripts switch a feature off
    if isinstance(current, bool) or isinstance(value, bool):
        return isinstance(current, bool) and isinstance(value, bool)
    if isinstance(current, float):
        return isinstance(value, (int, float))
    if isinstance(current, tuple):
        # the script unpacks a tuple (`beta1, beta2 = ADAM_BETAS`): keep its length and element kinds
        return (
            isinstance(value, (tuple, list))
            and len(value) == len(current)
            and all(_fits(c, v) for c, v in zip(current, value, strict=True))
        )
    if isinstance(current, list):
        return isinstance(value, (tuple, list))
    return isinstance(value, type(current))


def mismatch(knob: Knob, value: object) -> str | None:
    """Why `value` cannot replace the knob's current value, or None when it fits.

    The rule (one for `submit --set`, sweeps and searches): an int knob takes ints, a float knob
    ints or floats, a bool knob True or False, a str knob strings (quoted), a tuple knob a tuple
    of the same length whose elements fit (the script unpacks it), a list knob any list; None
    fits everywhere (it is how scripts switch a feature off). `expr` and `none` knobs take anything.
    """
    if knob.type in ("expr", "none") or _fits(knob.value, value):
        return None
    if knob.type == "tuple":
        shape = ", ".join(_kind(v) for v in knob.value)  # type: ignore[attr-defined]
        want = f"a tuple of {len(knob.value)} ({shape})"  # type: ignore[arg-type]
    else:
        want = {"int": "an int", "float": "a number", "bool": "True or False", "str": "a quoted string"}.get(
            knob.type, f"a {knob.type}"
        )
    given = f"a {_kind(value)} of {len(value)}" if isinstance(value, (tuple, list)) else _kind(value)
    return f"is {knob.type} `{knob.source}`, not {given}; give {want}"


def set_knobs(source: str, values: dict[str, str]) -> str:
    """Rewrite the values of some knobs, leaving every other byte as it was.

    Args:
        source: the script's text.
        values: knob name -> new value as Python source text (`"0.02"`, `"2**16"`, `"'L'"`).

    Returns:
        The new text.

    Raises:
        UsageError: a name is not a knob of the script, a value is not a literal or
            constant expression, or it does not fit the knob's type (`mismatch`).
    """
    sites = _sites(source)
    for name, text in values.items():
        if name not in sites:
            raise _unknown(name, list(sites))
        why = mismatch(sites[name].knob, parse_value(text))
        if why is not None:
            raise UsageError(f"`{name}={text}`: knob `{name}` {why}")
    data = source.encode("utf-8")
    # Splice from the end so earlier offsets stay valid.
    for site in sorted((sites[n] for n in values), key=lambda s: s.start, reverse=True):
        data = data[: site.start] + values[site.knob.name].strip().encode("utf-8") + data[site.end :]
    return data.decode("utf-8")
