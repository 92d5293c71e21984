"""Console sign-ins are throttled by django-axes, per user and per client address: past the
limit even the right password answers 429 with Retry-After and a page that says when to try
again; another address (or user) is unaffected; the lockout ends after the cool-off; each 429
is counted in fenceline_throttled_requests{kind="console_login"}. Real PostgreSQL, axes'
own database handler, Django's login view and backends (guardian's included)."""

import time
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tests.helpers import metric_value, parse_metrics

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery staple"
ATTACKER = "203.0.113.7"


@pytest.fixture
def alice(db):
    return get_user_model().objects.create_user(username="alice", password=PASSWORD)


def sign_in(username: str, password: str, address: str):
    return Client(REMOTE_ADDR=address).post("/accounts/login/", {"username": username, "password": password})


def throttled_count() -> float:
    scrape = Client().get("/metrics")  # 127.0.0.1: an allowed scraper without a token
    assert scrape.status_code == 200
    return metric_value(
        parse_metrics(scrape.content.decode()), "fenceline_throttled_requests", "_total", kind="console_login"
    )


def assert_locked_out(answer):
    assert answer.status_code == 429
    assert int(answer["Retry-After"]) > 0
    page = answer.content.decode()
    assert "Sign-in paused" in page and "Try again in" in page and 'href="/accounts/login/"' in page
    assert PASSWORD not in page


def test_fifty_wrong_passwords_for_one_user_then_the_right_one_answers_429(alice, settings):
    before = throttled_count()
    # Each wrong password from its own address: only the per-user count can lock.
    answers = [sign_in("alice", f"wrong-{i}", f"198.51.100.{i + 1}").status_code for i in range(50)]
    limit = settings.AXES_FAILURE_LIMIT
    assert answers[: limit - 1] == [200] * (limit - 1)  # the form again, "did not match"
    assert set(answers[limit:]) == {429}
    assert_locked_out(sign_in("alice", PASSWORD, "192.0.2.200"))
    assert throttled_count() - before == answers.count(429) + 1
    # Nobody else is locked: another user signs in from the attacker's last address.
    get_user_model().objects.create_user(username="bob", password=PASSWORD)
    assert sign_in("bob", PASSWORD, "198.51.100.50").status_code == 302


def test_fifty_wrong_passwords_from_one_address_then_the_right_one_answers_429(alice, settings):
    answers = [sign_in(f"guess-{i}", "wrong", ATTACKER).status_code for i in range(50)]
    assert set(answers[settings.AXES_FAILURE_LIMIT :]) == {429}
    assert_locked_out(sign_in("alice", PASSWORD, ATTACKER))
    # The same user from another address is not locked (no failure was hers).
    assert sign_in("alice", PASSWORD, "192.0.2.10").status_code == 302


def test_the_lockout_ends_after_the_cool_off(alice, settings):
    settings.AXES_COOLOFF_TIME = timedelta(seconds=5)
    for i in range(settings.AXES_FAILURE_LIMIT):
        sign_in("alice", f"wrong-{i}", ATTACKER)
    locked = sign_in("alice", PASSWORD, ATTACKER)
    assert locked.status_code == 429 and locked["Retry-After"] == "5"
    time.sleep(5.5)  # the configured five-second cool-off passes
    assert sign_in("alice", PASSWORD, ATTACKER).status_code == 302


def test_a_lockout_with_the_production_cool_off_outlasts_the_next_request(alice, settings):
    assert timedelta(minutes=1) <= settings.AXES_COOLOFF_TIME
    for i in range(settings.AXES_FAILURE_LIMIT):
        sign_in("alice", f"wrong-{i}", ATTACKER)
    answer = sign_in("alice", PASSWORD, ATTACKER)
    assert_locked_out(answer)
    assert int(answer["Retry-After"]) == int(settings.AXES_COOLOFF_TIME.total_seconds())
