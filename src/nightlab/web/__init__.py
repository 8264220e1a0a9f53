"""The live web dashboard: one local page that shows what the lab did and is doing.

Read-only by construction (SQLite `mode=ro`, GET routes only); see `app` for the routes
and the safety rules, `_views` for where each figure comes from (the same functions as
the CLI's `--json`). FastAPI and Jinja2 are imported only when the dashboard starts.

Usage:
    from nightlab.web import create_app
    app = create_app(Path("mylab"))
"""

from __future__ import annotations

from typing import Any

DEFAULT_PORT = 8350  # `nightlab dashboard`'s port unless `--port` says otherwise

__all__ = ["DEFAULT_PORT", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from nightlab.web.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
