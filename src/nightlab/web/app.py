"""The dashboard's web app: FastAPI routes, server-rendered pages and JSON endpoints.

    app = create_app(Path("mylab"), token=None)
    uvicorn.run(app, host="127.0.0.1", port=8350)

Pages are rendered on the server with Jinja2 (autoescaping on: a description, diff or
log line containing `<script>` shows as text). Each page wraps its changing part in
`#live`; `static/dashboard.js` re-fetches that part with `?partial=1` every few seconds
and swaps it in, so pages update without a reload and no template exists twice. The
overview and wave pages answer `?since=<version>` with 204 while the ledger has not
changed, which keeps an idle tab's polling almost free on a 5,000-experiment ledger.
Charts use uPlot (vendored under `static/`, MIT, no CDN) fed from the JSON endpoints.

Safety:
- read-only: only GET (and HEAD) routes exist; the ledger is opened with SQLite's
  `mode=ro`, so nothing here can start, stop or change anything;
- `allowed_hosts` rejects requests whose Host header is not the bound name (a page on
  another site cannot reach a loopback dashboard through DNS rebinding);
- with `token`, every request needs it: `Authorization: Bearer <token>`, `?token=`
  (which also sets an HttpOnly cookie so links and polling keep working) or that cookie;
- a Content-Security-Policy allows scripts and styles from the dashboard itself only.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from nightlab.errors import LedgerError, NightlabError, UnknownExperimentError, UsageError
from nightlab.views.encode import json_text
from nightlab.web import _views
from nightlab.web._readonly import ReadOnlyLab

TOKEN_COOKIE = "nightlab_token"
VERSIONED = {"overview", "waves", "wave"}  # pages whose data change only with the lab's version
POLL_MS = {"overview": 3000, "fleet": 2000, "experiment": 2000, "waves": 5000, "wave": 5000, "agent": 2000}
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def highlight_diff(diff: str) -> Markup:
    """The diff as HTML, syntax-highlighted by Pygments (which escapes every character of it)."""
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import DiffLexer

    return Markup(highlight(diff, DiffLexer(), HtmlFormatter(cssclass="hl", nowrap=False)))


def _duration(seconds: float | None) -> str:
    from nightlab.display import duration

    return duration(seconds)


def _number(value: Any, digits: int = 6) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _signed(value: Any, digits: int = 6) -> str:
    return "-" if value is None else f"{value:+.{digits}f}"


def _summary_value(value: Any, key: str, metric: str, metrics: dict[str, Any]) -> str:
    """A summary value in the metrics table (`display.number`, with `display.metric_note`)."""
    from nightlab.display import metric_note, number

    note = metric_note(key, metrics)
    return number(value, metric=key == metric) + (f" ({note})" if note else "")


def _templates() -> Environment:
    env = Environment(
        loader=PackageLoader("nightlab.web", "templates"),
        autoescape=select_autoescape(("html",), default=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    from nightlab.display import clock, fact

    env.filters.update(
        duration=_duration,
        number=_number,
        signed=_signed,
        clock=clock,
        fact=lambda value, key="": fact(key, value),  # `{{ v | fact(k) }}`
        summary=_summary_value,
    )
    env.filters["highlight_diff"] = highlight_diff
    return env


class _ReadOnlyApp:
    """Opens the lab read-only for each request and renders pages and fragments."""

    def __init__(self, lab_dir: Path) -> None:
        self.lab_dir = lab_dir
        self.env = _templates()
        self.cache = _views.VersionCache()

    def cached(
        self, lab: ReadOnlyLab, name: str, fn: Callable[..., dict[str, Any]], *args: Any
    ) -> dict[str, Any]:
        """`fn(lab, *args)`, computed once per version of the lab (for data that only events change)."""
        return self.cache.get(lab, name, lambda lab: fn(lab, *args))

    def data(self, fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
        with ReadOnlyLab(self.lab_dir) as lab:
            return fn(lab, *args)

    def page(self, request: Request, name: str, fn: Callable[..., dict[str, Any]], *args: Any) -> Response:
        """The full page, or only its live fragment with `?partial=1`.

        Pages whose data carry a `version` answer 204 to `?since=<version>` while it is
        current, before computing anything.
        """
        partial = bool(request.query_params.get("partial"))
        since = request.query_params.get("since")
        with ReadOnlyLab(self.lab_dir) as lab:
            if partial and since and name in VERSIONED and since == lab.version():
                return Response(
                    status_code=204, headers={"Cache-Control": "no-store", "X-Nightlab-Version": since}
                )
            data = fn(lab, *args)
        headers = {"Cache-Control": "no-store"}
        if data.get("version") is not None:
            headers["X-Nightlab-Version"] = str(data["version"])
        template = self.env.get_template(f"{name}_live.html" if partial else "page.html")
        context = {"d": data, "page": name, "poll_ms": POLL_MS[name], "lab_name": self.lab_dir.name}
        return HTMLResponse(template.render(**context), headers=headers)


class _TokenMiddleware:
    """Every request must carry the token (header, query or cookie); a query token sets the cookie."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        header = request.headers.get("authorization", "")
        offered = [
            header[7:] if header.lower().startswith("bearer ") else "",
            request.query_params.get("token", ""),
            request.cookies.get(TOKEN_COOKIE, ""),
        ]
        if not any(o and secrets.compare_digest(o.encode(), self.token.encode()) for o in offered):
            response = PlainTextResponse(
                "401: this dashboard needs its token: open it as /?token=TOKEN", status_code=401
            )
            await response(scope, receive, send)
            return
        if request.query_params.get("token"):

            async def send_with_cookie(message: dict) -> None:
                if message["type"] == "http.response.start":
                    cookie = f"{TOKEN_COOKIE}={self.token}; Path=/; HttpOnly; SameSite=Strict"
                    message.setdefault("headers", []).append((b"set-cookie", cookie.encode()))
                await send(message)

            await self.app(scope, receive, send_with_cookie)
            return
        await self.app(scope, receive, send)


def host_name(header: str) -> str:
    """The host of a Host header without its port: `[::1]:8350` -> `::1`, `localhost:8350` -> `localhost`."""
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class _HostMiddleware:
    """400 for a Host header outside `allowed` (Starlette's TrustedHostMiddleware mangles IPv6)."""

    def __init__(self, app: Any, allowed: frozenset[str]) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            host = host_name(Request(scope).headers.get("host", ""))
            if host not in self.allowed:
                response = PlainTextResponse(f"400: host `{host}` is not served here", status_code=400)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(
    lab_dir: Path, *, token: str | None = None, allowed_hosts: list[str] | tuple[str, ...] = ("*",)
) -> FastAPI:
    """The dashboard of the lab at `lab_dir`.

    Args:
        lab_dir: the lab directory (read, never written).
        token: when set, every request must carry it.
        allowed_hosts: Host header values to accept (`*` for any).

    Raises:
        NotALabError / ConfigError / LedgerError: `lab_dir` is not a readable lab.
    """
    site = _ReadOnlyApp(lab_dir)
    with ReadOnlyLab(lab_dir) as lab:  # fail at start-up, not on the first request
        _views.overview(lab, site.cache)  # and have the first page view served from the cache
    # no /docs or /openapi.json: they load their UI from a CDN and list nothing a researcher needs
    app = FastAPI(title="nightlab dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    static = Path(__file__).parent / "static"
    app.mount("/static", StaticFiles(directory=static), name="static")
    _add_guards(app, site, lab_dir, token=token, allowed_hosts=allowed_hosts)
    _add_api(app, site)
    _add_pages(app, site)
    return app


def _add_guards(
    app: FastAPI,
    site: _ReadOnlyApp,
    lab_dir: Path,
    *,
    token: str | None,
    allowed_hosts: list[str] | tuple[str, ...],
) -> None:
    """Security headers, the host and token checks, and the error pages."""

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Callable) -> Response:
        response = await call_next(request)
        response.headers.setdefault("Content-Security-Policy", _CSP)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "no-referrer")
        response.headers.setdefault("X-Frame-Options", "DENY")
        return response

    if list(allowed_hosts) != ["*"]:
        app.add_middleware(_HostMiddleware, allowed=frozenset(allowed_hosts))
    if token:
        app.add_middleware(_TokenMiddleware, token=token)

    @app.exception_handler(UnknownExperimentError)
    async def not_found(request: Request, exc: UnknownExperimentError) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": str(exc)}, status_code=404)
        html = site.env.get_template("error.html").render(message=str(exc), page="", lab_name=lab_dir.name)
        return HTMLResponse(html, status_code=404)

    @app.exception_handler(NightlabError)
    async def lab_error(request: Request, exc: NightlabError) -> Response:
        # bad input in a URL is the client's (400), a damaged or busy ledger the lab's (503)
        status = 503 if isinstance(exc, LedgerError) else 400 if isinstance(exc, UsageError) else 500
        return JSONResponse({"error": str(exc)}, status_code=status)


def _add_api(app: FastAPI, site: _ReadOnlyApp) -> None:
    """The JSON routes: the same documents as the commands' `--json`."""

    def dump(data: Any) -> Response:
        body = data if isinstance(data, str) else json_text(data)
        return Response(body, media_type="application/json", headers={"Cache-Control": "no-store"})

    @app.get("/api/results")
    def api_results() -> Response:
        """Exactly `nightlab results --json`."""
        return dump(site.data(site.cache.results_json))

    @app.get("/api/status")
    def api_status() -> Response:
        """Exactly `nightlab status --json`."""
        return dump(site.data(_views._fleet_state))

    @app.get("/api/overview")
    def api_overview() -> Response:
        return dump(site.data(_views.overview, site.cache))

    @app.get("/api/progress")
    def api_progress() -> Response:
        # one point per experiment: keep the encoded body too (~50 ms to encode at 5,000)
        return dump(
            site.data(
                lambda lab: site.cache.get(
                    lab, "progress-json", lambda lab: json_text(_views.progress_series(lab, site.cache))
                )
            )
        )

    @app.get("/api/fleet")
    def api_fleet() -> Response:
        return dump(site.data(_views.fleet))

    @app.get("/api/experiments/{experiment_id}")
    def api_experiment(experiment_id: str) -> Response:
        return dump(site.data(_views.experiment, experiment_id))

    @app.get("/api/waves")
    def api_waves() -> Response:
        return dump(site.data(site.cached, "waves", _views.waves))

    @app.get("/api/waves/{wave_id}")
    def api_wave(wave_id: str) -> Response:
        return dump(site.data(site.cached, f"wave:{wave_id}", _views.wave, wave_id))

    @app.get("/api/agent")
    def api_agent() -> Response:
        return dump(site.data(_views.agent))


def _add_pages(app: FastAPI, site: _ReadOnlyApp) -> None:
    """The HTML pages."""

    @app.get("/", response_class=HTMLResponse)
    def overview_page(request: Request) -> Response:
        return site.page(request, "overview", _views.overview, site.cache)

    @app.get("/fleet", response_class=HTMLResponse)
    def fleet_page(request: Request) -> Response:
        return site.page(request, "fleet", _views.fleet)

    @app.get("/experiments/{experiment_id}", response_class=HTMLResponse)
    def experiment_page(request: Request, experiment_id: str) -> Response:
        return site.page(request, "experiment", _views.experiment, experiment_id)

    @app.get("/waves", response_class=HTMLResponse)
    def waves_page(request: Request) -> Response:
        return site.page(request, "waves", site.cached, "waves", _views.waves)

    @app.get("/waves/{wave_id}", response_class=HTMLResponse)
    def wave_page(request: Request, wave_id: str) -> Response:
        return site.page(request, "wave", site.cached, f"wave:{wave_id}", _views.wave, wave_id)

    @app.get("/agent", response_class=HTMLResponse)
    def agent_page(request: Request) -> Response:
        return site.page(request, "agent", _views.agent)

    @app.get("/highlight.css")
    def highlight_css() -> Response:
        from pygments.formatters import HtmlFormatter

        css = HtmlFormatter(style="default").get_style_defs(".hl")
        return Response(css, media_type="text/css", headers={"Cache-Control": "max-age=3600"})
