"""Two answers of the console a browser would otherwise show badly (issue 40): an htmx request
from a session that has ended sends the whole browser to the sign-in page (``HX-Redirect``),
never the sign-in page swapped into a card; a GET of an action URL answers the console's 405
page saying the action is a button."""

from django.test import Client
from django.urls import reverse

from tests.factories import unknown_cases
from tests.helpers import Browser, snapshot


def test_an_htmx_poll_after_the_session_ended_sends_the_browser_to_sign_in(acme):
    answer = Client().get(
        reverse("home"), headers={"HX-Request": "true", "HX-Current-URL": "http://testserver/cases/?status=mine"}
    )
    assert answer.status_code == 200
    assert answer["HX-Redirect"] == "/accounts/login/?next=%2Fcases%2F%3Fstatus%3Dmine"
    assert b"Sign in" not in answer.content


def test_an_htmx_claim_after_signing_out_changes_nothing_and_sends_the_browser_to_sign_in(acme, operator):
    (case,) = unknown_cases(acme.worker, 1)
    browser = Browser(operator)
    browser.client.session.flush()  # signed out in another tab: the session is gone, the cookies stay
    before = snapshot()
    answer = browser.post(
        reverse("case-claim", args=[case.pk]),
        headers={"HX-Request": "true", "HX-Current-URL": "http://testserver/cases/"},
    )
    assert answer["HX-Redirect"] == "/accounts/login/?next=%2Fcases%2F"
    assert snapshot() == before


def test_a_plain_request_after_the_session_ended_is_still_redirected(acme):
    answer = Client().get(reverse("cases"))
    assert answer.status_code == 302
    assert answer["Location"].startswith("/accounts/login/")
    assert "HX-Redirect" not in answer


def test_a_get_of_an_action_url_answers_the_console_405_page(acme, operator):
    (case,) = unknown_cases(acme.worker, 1)
    before = snapshot()
    answer = Browser(operator).get(reverse("case-claim", args=[case.pk]))
    assert answer.status_code == 405
    assert answer["Allow"] == "POST"
    body = answer.content.decode()
    assert "This address is an action" in body and "use the button" in body
    assert 'aria-label="Main"' in body  # the console's layout, with its navigation
    assert snapshot() == before


def test_the_api_keeps_its_own_answer_for_a_wrong_method(acme):
    answer = Client().get("/api/v1/runs")
    assert b"This address is an action" not in answer.content
