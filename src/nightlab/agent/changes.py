"""What a snapshot changes against its parent, in the journal's words.

Knob edits read `MATRIX_LR 0.04->0.02` (`search.knobs` reads the constants); other edited
lines are named by the function, class or module-level name they belong to, with line counts
(split out of journal.py, which groups these changes into ideas and themes).
Every file of every snapshot is read through one `git cat-file --batch` process
(`read_blobs`), not two git calls per idea: 900 experiments take well under a second.

Usage:
    change = summarize_change(old_text, new_text, file="train.py")
    change.describe()   # "LR 0.01->0.02, GPT.forward +3/-1"
"""

from __future__ import annotations

import difflib
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass

from nightlab.errors import SnapshotError, UsageError

_DEF = re.compile(r"^(\s*)(?:async\s+def|def|class)\s+(\w+)")
_ASSIGN = re.compile(r"^([A-Za-z_]\w*)\s*(?::[^=]*)?=")


@dataclass(frozen=True)
class Change:
    """What a snapshot changes against its parent, in the journal's words.

    Attributes:
        knobs: (name, old source, new source) per changed UPPERCASE constant; None for added/removed.
        scopes: (scope, lines added, lines removed) per function/class/name with other edits.
        files: (file, `deleted` or `added`, its lines) per editable file one side lacks: one
            change named for the file, not every knob and function it holds.
        seed_only: every edit is a seed change (a `*SEED*` knob or lines that mention a seed).
    """

    knobs: tuple[tuple[str, str | None, str | None], ...] = ()
    scopes: tuple[tuple[str, int, int], ...] = ()
    files: tuple[tuple[str, str, int], ...] = ()
    seed_only: bool = False

    @property
    def empty(self) -> bool:
        return not self.knobs and not self.scopes and not self.files

    @property
    def touched(self) -> tuple[str, ...]:
        names = {k for k, _, _ in self.knobs} | {s for s, _, _ in self.scopes}
        return tuple(sorted(names | {f"{f} ({how})" for f, how, _ in self.files}))

    def describe(self) -> str:
        parts = [f"{f} {how} ({'-' if how == 'deleted' else '+'}{n} lines)" for f, how, n in self.files]
        parts += [
            f"{k} {old if old is not None else '(new)'}->{new if new is not None else '(removed)'}"
            for k, old, new in self.knobs
        ]
        parts += [f"{s} +{a}/-{r}" for s, a, r in self.scopes]
        return ", ".join(parts) if parts else "no change"


def _scopes(lines: list[str]) -> list[str]:
    """For each line: the dotted def/class path it belongs to, a module-level name, or `module`."""
    out: list[str] = []
    stack: list[tuple[int, str]] = []
    for line in lines:
        stripped = line.lstrip()
        if not stripped or stripped.startswith("#"):
            out.append(".".join(n for _, n in stack) or "module")
            continue
        indent = len(line) - len(stripped)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        m = _DEF.match(line)
        if m:
            stack.append((indent, m.group(2)))
        if stack:
            out.append(".".join(n for _, n in stack))
        else:
            assign = _ASSIGN.match(line)
            out.append(assign.group(1) if assign else "module")
    return out


def _knob_sources(text: str) -> dict[str, tuple[str, int]] | None:
    from nightlab.search.knobs import list_knobs

    try:
        return {k.name: (k.source, k.line) for k in list_knobs(text)}
    except UsageError:  # the file does not parse (a syntax-error idea): fall back to lines only
        return None


def summarize_change(old: str, new: str, *, file: str | None = None) -> Change:
    """Describe the edit from `old` to `new` (one file's text).

    Args:
        file: prefix for scope names, for labs with several editable files.
    """
    old_knobs, new_knobs = _knob_sources(old), _knob_sources(new)
    knobs: list[tuple[str, str | None, str | None]] = []
    skip_old: set[int] = set()
    skip_new: set[int] = set()
    if old_knobs is not None and new_knobs is not None:
        for name in sorted(set(old_knobs) | set(new_knobs)):
            a, b = old_knobs.get(name), new_knobs.get(name)
            if a is not None and b is not None and a[0] == b[0]:
                continue
            knobs.append((name, a[0] if a else None, b[0] if b else None))
            # a knob's value may span lines; its first line is the one that carries the change
            if a:
                skip_old.add(a[1] - 1)
            if b:
                skip_new.add(b[1] - 1)
    old_lines, new_lines = old.splitlines(), new.splitlines()
    old_scope, new_scope = _scopes(old_lines), _scopes(new_lines)
    counts: dict[str, list[int]] = {}
    other: list[str] = []
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        for i in range(i1, i2):
            if i not in skip_old and old_lines[i].strip():
                counts.setdefault(old_scope[i], [0, 0])[1] += 1
                other.append(old_lines[i])
        for j in range(j1, j2):
            if j not in skip_new and new_lines[j].strip():
                counts.setdefault(new_scope[j], [0, 0])[0] += 1
                other.append(new_lines[j])
    prefix = f"{file}:" if file else ""
    scopes = tuple((prefix + s, a, r) for s, (a, r) in sorted(counts.items()))
    knob_changes = tuple((prefix + k, a, b) for k, a, b in knobs)
    seed_only = bool(knobs or other) and all("SEED" in k.upper() for k, _, _ in knobs)
    seed_only = seed_only and all("seed" in line.lower() for line in other)
    return Change(knob_changes, scopes, seed_only=seed_only)


def file_change(name: str, old: str | None, new: str | None, *, prefix: bool) -> Change:
    """What one editable file's edit changes; `None` is a side that lacks the file.

    A deleted file is one change, `train.py deleted`: read as text against "" it was every knob
    removed and a theme named `ADAM_BETAS, ASPECT_RATIO, ATTENTION +75` in the agent's prompt.

    Args:
        prefix: name scopes and knobs `file:NAME` (labs with several editable files).
    """
    if new is None:
        return Change() if old is None else Change(files=((name, "deleted", len(old.splitlines())),))
    if old is None:
        return Change(files=((name, "added", len(new.splitlines())),))
    return summarize_change(old, new, file=name if prefix else None)


def merge(changes: Iterable[Change]) -> Change:
    changes = list(changes)
    knobs = tuple(k for c in changes for k in c.knobs)
    scopes = tuple(s for c in changes for s in c.scopes)
    files = tuple(f for c in changes for f in c.files)
    seed_only = any(not c.empty for c in changes) and all(c.seed_only or c.empty for c in changes)
    return Change(knobs, scopes, files, seed_only)


def read_blobs(lab_dir, specs: list[str]) -> dict[str, str | None]:
    """`commit:path` -> text (None when missing), all through one `git cat-file --batch`."""
    if not specs:
        return {}
    proc = subprocess.run(
        ["git", "cat-file", "--batch"],
        cwd=lab_dir,
        input="".join(s + "\n" for s in specs).encode(),
        capture_output=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SnapshotError(f"git cat-file failed: {proc.stderr.decode(errors='replace').strip()}")
    out: dict[str, str | None] = {}
    data, pos = proc.stdout, 0
    for spec in specs:
        end = data.index(b"\n", pos)
        header = data[pos:end].decode(errors="replace").split()
        pos = end + 1
        if len(header) == 3 and header[1] == "blob":
            size = int(header[2])
            out[spec] = data[pos : pos + size].decode("utf-8", errors="replace")
            pos += size + 1
        else:  # "<spec> missing", or a tree/commit where a file was expected
            out[spec] = None
            if len(header) == 3:
                pos += int(header[2]) + 1
    return out
