"""Failed worker tokens are throttled per client address: past FENCELINE_TOKEN_FAILURE_LIMIT
failures within the window, that address's failed attempts answer 429 TOO_MANY_REQUESTS with
Retry-After (in the API's error body too) instead of 401, each counted in
fenceline_throttled_requests{kind="worker_token"}; a valid token keeps working from it; another
address is unaffected; the window ends. The count lives in PostgreSQL, shared by every process:
a test here and requests over real HTTP count into the same window."""

import secrets
import time

import pytest
from django.test import Client

from ledger.models import TokenFailureWindow
from tests.helpers import metric_value, parse_metrics

pytestmark = pytest.mark.django_db

ATTACKER = "203.0.113.9"
HEARTBEAT = "/api/v1/workers/me/heartbeat"


def heartbeat(token: str, address: str, **headers):
    client = Client(REMOTE_ADDR=address)
    return client.post(
        HEARTBEAT, "{}", content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}", **headers
    )


def throttled_count() -> float:
    scrape = Client().get("/metrics")
    assert scrape.status_code == 200
    return metric_value(
        parse_metrics(scrape.content.decode()), "fenceline_throttled_requests", "_total", kind="worker_token"
    )


def test_five_hundred_random_tokens_get_429_past_the_limit_and_a_valid_token_still_works(acme, settings):
    limit = settings.FENCELINE["TOKEN_FAILURE_LIMIT"]
    before = throttled_count()
    answers = [heartbeat("flw_" + secrets.token_urlsafe(32), ATTACKER) for _ in range(500)]
    statuses = [a.status_code for a in answers]
    assert statuses[:limit] == [401] * limit
    assert statuses[limit:] == [429] * (500 - limit)
    throttled = answers[-1]
    window_s = settings.FENCELINE["TOKEN_FAILURE_WINDOW_S"]
    assert 0 < int(throttled["Retry-After"]) <= window_s
    body = throttled.json()
    assert body["error"] == "TOO_MANY_REQUESTS" and body["retry_after_s"] == int(throttled["Retry-After"])
    assert throttled_count() - before == 500 - limit
    assert TokenFailureWindow.objects.get(address=ATTACKER).failures == 500

    # A valid token keeps working from the throttled address (only failures are throttled).
    assert heartbeat(acme.token, ATTACKER).status_code == 200
    # Another address is unaffected: its wrong token is a plain 401.
    assert heartbeat("flw_" + secrets.token_urlsafe(32), "198.51.100.20").status_code == 401
    # A malformed or oversized token is a failure too.
    assert heartbeat("x" * 500, ATTACKER).status_code == 429


def test_the_window_ends(acme, settings):
    settings.FENCELINE = {**settings.FENCELINE, "TOKEN_FAILURE_LIMIT": 3, "TOKEN_FAILURE_WINDOW_S": 1}
    statuses = [heartbeat("wrong", ATTACKER).status_code for _ in range(5)]
    assert statuses == [401, 401, 401, 429, 429]
    time.sleep(1.1)  # the configured one-second window passes
    assert heartbeat("wrong", ATTACKER).status_code == 401
    assert TokenFailureWindow.objects.get(address=ATTACKER).failures == 1


def test_behind_the_declared_proxy_the_address_is_the_one_it_appended(acme, settings):
    settings.FENCELINE = {**settings.FENCELINE, "TOKEN_FAILURE_LIMIT": 2}
    settings.BEHIND_TLS_PROXY = True
    proxy = "10.0.0.5"
    # The client's own X-Forwarded-For entries come first; the proxy appends the address it saw.
    for spoofed in ("1.1.1.1", "2.2.2.2", "3.3.3.3"):
        heartbeat("wrong", proxy, HTTP_X_FORWARDED_FOR=f"{spoofed}, {ATTACKER}")
    assert heartbeat("wrong", proxy, HTTP_X_FORWARDED_FOR=f"9.9.9.9, {ATTACKER}").status_code == 429
    assert heartbeat("wrong", proxy, HTTP_X_FORWARDED_FOR="198.51.100.30").status_code == 401
    assert set(TokenFailureWindow.objects.values_list("address", flat=True)) == {ATTACKER, "198.51.100.30"}
    # Without the declaration the header is the client's word: REMOTE_ADDR counts.
    settings.BEHIND_TLS_PROXY = False
    heartbeat("wrong", proxy, HTTP_X_FORWARDED_FOR=ATTACKER)
    assert TokenFailureWindow.objects.filter(address=proxy).exists()


@pytest.mark.django_db(transaction=True)
def test_failures_over_real_http_and_in_process_count_into_one_window(api_for, settings):
    settings.FENCELINE = {**settings.FENCELINE, "TOKEN_FAILURE_LIMIT": 4}
    over_http = api_for(token="wrong")  # the live server's own threads and database connections
    assert [over_http.post("/workers/me/heartbeat").status for _ in range(2)] == [401, 401]
    assert [heartbeat("wrong", "127.0.0.1").status_code for _ in range(2)] == [401, 401]
    answer = over_http.post("/workers/me/heartbeat")
    assert answer.status == 429 and answer.body["error"] == "TOO_MANY_REQUESTS"
