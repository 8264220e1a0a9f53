"""The dashboard's routes with hostile ids and query strings answer 4xx (or a page), never a
500 and never a file from outside the lab's dashboard (property-based)."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nightlab.testing.reliability import nightlab, submit_many, wait_finished

ROUTES = ["/api/experiments/{}", "/experiments/{}", "/api/waves/{}", "/waves/{}", "/static/{}"]
PAGES = ["/", "/fleet", "/waves", "/agent", "/api/results", "/api/status", "/api/overview", "/api/progress"]
IDS = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        [
            "../../../../etc/passwd",
            "..%2f..%2fnightlab.toml",
            "%2e%2e/%2e%2e/etc/passwd",
            "e0001/../../x",
            "..",
            ".",
            "e0001%00",
            "<script>alert(1)</script>",
            "w001' OR 1=1 --",
            "e" * 5000,
            "%",
            "%%",
            "\u202e",
            "../.nightlab/ledger.db",
            "....//....//etc/passwd",
            "e0001;",
            "/etc/passwd",
        ]
    ),
)
SECRETS = ("root:x:0:0", "SQLite format 3", "[target]")  # /etc/passwd, the ledger, nightlab.toml


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from fastapi.testclient import TestClient

    from nightlab.testing.reliability import make_fast_lab, stop_lab
    from nightlab.web import create_app

    lab = make_fast_lab(tmp_path_factory.mktemp("dash"), slots=2)
    try:
        ids = submit_many(lab, 2, start=True)
        wait_finished(lab, ids)
        nightlab("fleet", "stop", cwd=lab)
        with TestClient(create_app(lab), raise_server_exceptions=False) as c:
            yield c
    finally:
        stop_lab(lab)


def _check(response) -> None:
    assert response.status_code < 500, (response.request.url, response.status_code, response.text[:300])
    body = response.text
    for secret in SECRETS:
        assert secret not in body, (response.request.url, secret)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(ROUTES), eid=IDS, encode=st.booleans())
def test_hostile_ids_never_500_or_escape(client, route, eid, encode):
    path = route.format(quote(eid, safe="") if encode else quote(eid, safe="/%"))
    response = client.get(path)
    _check(response)
    if route != "/static/{}" and response.status_code >= 400:
        assert response.status_code in (400, 404, 405, 422), response.status_code


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    page=st.sampled_from(PAGES + ["/experiments/e0001", "/waves/w001", "/api/experiments/e0001"]),
    query=st.dictionaries(st.sampled_from(["partial", "since", "token", "tail", "x", ""]), IDS, max_size=3),
)
def test_hostile_query_strings_never_500(client, page, query):
    _check(client.get(page, params=query))


def test_the_real_pages_still_answer(client):
    for page in PAGES + ["/experiments/e0001", "/api/experiments/e0001"]:
        assert client.get(page).status_code == 200, page
