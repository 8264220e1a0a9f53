"""The dashboard in a real browser: Debian's chromium driven by Playwright.

Loads the overview of the session lab (finished, running, queued and crashed experiments),
checks that the leaderboard and the progress chart render and that the chart's hover shows
a description, that the page updates without a reload, follows a leaderboard link to an
experiment page, and saves screenshots under the test's temporary directory.

Needs Debian's `chromium` on PATH (`apt-get install chromium`); never `playwright install`. Without
it the run says so before the first test and the test is skipped, except under CI (CI set),
where a missing browser is a failure (tests/needs.py, tested in tests/core/test_needs.py).
Run: .venv/bin/python -m pytest -q tests/web/test_browser.py
"""

from __future__ import annotations

import socket
import threading

import pytest

from labkit import wait_until
from needs import chromium_path

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


@pytest.fixture
def server(night_lab):
    """The dashboard of the session lab served by uvicorn on 127.0.0.1 in a thread."""
    import uvicorn

    from nightlab.web.app import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(create_app(night_lab.path), host="127.0.0.1", port=port, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    wait_until(lambda: srv.started, timeout=20, what="uvicorn to start")
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(timeout=10)


@pytest.fixture
def browser_page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS, headless=True)
        # bypass_csp: the page's CSP would also stop injected scripts, and this test must show
        # that escaping alone keeps them inert (test_xss checks the CSP header itself)
        page = browser.new_page(viewport={"width": 1280, "height": 900}, bypass_csp=True)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("dialog", lambda d: (errors.append(f"dialog: {d.message}"), d.dismiss()))
        yield page, errors
        browser.close()


def test_overview_chart_link_and_live_update(night_lab, client, server, browser_page, tmp_path):
    page, errors = browser_page
    results = night_lab.cli_json("results")
    ok_ids = [r["id"] for r in results["experiments"] if r["val_bpb"] is not None]

    # --- overview: leaderboard rows in the CLI's order, chart drawn with every ok run
    page.goto(server + "/")
    rows = page.locator("#leaderboard tbody tr")
    assert rows.count() == len(ok_ids)
    assert [rows.nth(i).locator("a.id").inner_text() for i in range(rows.count())] == ok_ids
    page.wait_for_selector("#progress-chart canvas")
    page.wait_for_function(f"document.getElementById('progress-chart').dataset.points === '{len(ok_ids)}'")
    assert page.locator("#progress-chart .u-legend").count() == 1

    # the XSS experiment's description is on the page as text, and nothing ran
    assert page.get_by_text("window.__xss = 1", exact=False).first.is_visible()
    assert page.evaluate("window.__xss") is None

    # hover over the chart: the tooltip names an experiment and shows its description
    box = page.locator("#progress-chart .u-over").bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    tooltip = page.locator("#progress-chart .tooltip")
    tooltip.wait_for(state="visible")
    assert any(eid in tooltip.inner_text() for eid in ok_ids)
    page.screenshot(path=str(tmp_path / "overview.png"), full_page=True)

    # a change recorded in the ledger reaches the open overview: the fragment is swapped, the
    # chart (kept in place, not re-created by the swap) redraws, and the page never reloads
    from nightlab.ledger import open_ledger

    page.evaluate("window.__marker = 'same page'")
    chart = page.locator("#progress-chart")
    chart.evaluate("el => { el.__original = true; }")
    with open_ledger(night_lab.path) as ledger:
        ledger.log_event("test-touch")  # moves the version; no figure changes
    page.wait_for_function(
        "Number(document.getElementById('progress-chart').dataset.draws) >= 2", timeout=15000
    )
    assert chart.evaluate("el => el.__original === true")
    assert page.evaluate("window.__marker") == "same page"
    assert rows.count() == len(ok_ids)

    # --- fleet page updates in place: a new loss line appears without a reload
    page.goto(server + "/fleet")
    assert "2.7500" in page.locator("#workers").inner_text()
    page.evaluate("window.__marker = 'same page'")
    original = night_lab.running_log.read_text()
    try:
        night_lab.running_log.write_text(original + "step 00050 (50%) | loss: 1.875 |\r")
        page.wait_for_function(
            "document.getElementById('workers').innerText.includes('1.8750')", timeout=15000
        )
    finally:
        night_lab.running_log.write_text(original)
    assert page.evaluate("window.__marker") == "same page"
    page.screenshot(path=str(tmp_path / "fleet.png"), full_page=True)

    # --- follow the first leaderboard link to its experiment page
    page.goto(server + "/")
    first = page.locator("#leaderboard tbody tr").first.locator("a.id")
    eid = first.inner_text()
    first.click()
    page.wait_for_url(f"**/experiments/{eid}")
    assert eid in page.locator("main h2").first.inner_text()
    assert page.locator("#metrics").is_visible()
    assert page.locator(".diff .hl").count() == 1 or "no change against the parent" in page.content()
    page.screenshot(path=str(tmp_path / "experiment.png"), full_page=True)
    # an experiment that changed a knob shows its diff, highlighted
    page.goto(server + f"/experiments/{night_lab.ids['better']}")
    diff = page.locator(".diff .hl")
    assert diff.count() == 1 and "+LR = 0.02" in diff.inner_text()
    assert diff.locator("span.gi").count() >= 1  # Pygments' class for inserted lines

    # --- the XSS experiment's page: description, knob and diff as text, nothing executed
    page.goto(server + f"/experiments/{night_lab.ids['xss']}")
    assert "<script>window.__xss = 1</script>" in page.locator("main h2").first.inner_text()
    assert page.evaluate("window.__xss") is None
    page.screenshot(path=str(tmp_path / "xss.png"), full_page=True)

    # --- a wave: its effects plot is drawn
    page.goto(server + f"/waves/{night_lab.wave}")
    page.wait_for_selector("#effects-chart canvas")
    assert page.locator("#effects tbody tr").count() >= 2
    page.screenshot(path=str(tmp_path / "wave.png"), full_page=True)

    assert errors == []
    for name in ("overview", "fleet", "experiment", "xss", "wave"):
        assert (tmp_path / f"{name}.png").stat().st_size > 10_000
