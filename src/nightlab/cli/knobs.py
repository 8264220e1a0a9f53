from __future__ import annotations

import click

from nightlab.cli._common import console, emit_json, json_option, with_lab

VALUE_WIDTH = 40  # a long tuple spread over lines must not widen the table past a terminal


def one_line(source: str, width: int = VALUE_WIDTH) -> str:
    """A knob's source on one line, cut at `width` with `…` (`--json` has the full text)."""
    text = " ".join(source.split())
    return text if len(text) <= width else text[: width - 1] + "…"


@click.command("knobs")
@json_option
@with_lab
def command(lab, as_json) -> None:
    """The UPPERCASE module-level constants of the editable files, with values and types.

    These are what `submit --set`, `sweep` and `search --space` can change; a rewrite
    touches only the value, every other byte of the file stays as it is.

    \b
    Example:
      nightlab knobs --json | jq -r '.[] | "\\(.name)=\\(.source)"'
    """
    from nightlab.errors import UsageError
    from nightlab.search.knobs import list_knobs

    rows = []
    for name in lab.config.target.editable:
        path = lab.path / name
        if not path.is_file():
            continue
        try:
            knobs = list_knobs(path.read_text(encoding="utf-8"))
        except (UsageError, UnicodeDecodeError):
            continue  # not a Python file: it has no knobs
        rows += [
            {"name": k.name, "source": k.source, "type": k.type, "file": name, "line": k.line} for k in knobs
        ]
    if as_json:
        emit_json(rows)
        return
    if not rows:
        raise UsageError(
            f"no knobs in `{', '.join(lab.config.target.editable)}`: a knob is a module-level "
            "`NAME = literal` with an UPPERCASE name"
        )
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for col in ("name", "value", "type", "where"):
        table.add_column(col, no_wrap=True)
    for r in rows:
        table.add_row(r["name"], one_line(r["source"]), r["type"], f"{r['file']}:{r['line']}")
    console().print(table)
