"""``next`` after an action, a sign-in or a sign-out: a path on this site is followed; anything else —
another site, a scheme-relative or backslashed host, a script URL, an encoded variant — goes
to the page's default, and never a 500 after the action committed (console.views.common.next_url)."""

import pytest
from django.test import Client
from django.urls import reverse

from ledger.models import RunResource, Worker
from tests.factories import stuck_resource, user_with
from tests.helpers import Browser

HOSTILE = [
    "https://evil.example/phish",
    "http://testserver.evil.example/",
    "//evil.example/x",
    "///evil.example/x",
    "/\\evil.example/x",
    "\\\\evil.example/x",
    "/\\/evil.example",
    "javascript:alert(1)",
    "JaVaScRiPt:alert(document.domain)",
    " javascript:alert(1)",
    "\tjavascript:alert(1)",
    "https:evil.example",
    "https:/evil.example",
    "data:text/html,<script>alert(1)</script>",
    "%2F%2Fevil.example",
    "/%2F%2Fevil.example",
    "/%5Cevil.example",
    "%2f%5cevil.example",
    "javascript%3Aalert(1)",
    "/\x00//evil.example",
    "/\r\nLocation: https://evil.example",
    "evil.example",
    "../../evil",
    "/" + "a" * 5000,
]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_worker_action_with_a_hostile_next_commits_and_goes_to_the_workers_page(acme, admin, hostile):
    answer = Browser(admin).post(
        reverse("worker-act", args=[acme.worker.pk]), {"action": "drain", "reason": "patching", "next": hostile}
    )
    assert answer.status_code == 302 and answer["Location"] == "/workers/"
    assert Worker.objects.get(pk=acme.worker.pk).status == "DRAINING"


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_resource_action_with_a_hostile_next_commits_and_goes_to_the_resources_page(acme, admin, hostile):
    resource = stuck_resource(acme.worker)
    answer = Browser(admin).post(
        reverse("resource-act", args=[resource.pk]), {"action": "mark_released", "reason": "gone", "next": hostile}
    )
    assert answer.status_code == 302 and answer["Location"] == "/resources/"
    assert RunResource.objects.get(pk=resource.pk).state == "RELEASED"


def test_a_path_on_this_site_is_followed_with_its_query(acme, admin):
    here = f"/workers/{acme.worker.pk}/?tab=leases"
    answer = Browser(admin).post(
        reverse("worker-act", args=[acme.worker.pk]), {"action": "drain", "reason": "patching", "next": here}
    )
    assert answer.status_code == 302 and answer["Location"] == here


def vera(acme):
    user = user_with("viewer", acme.tenant, "vera")
    user.set_password("correct horse battery")
    user.save()


@pytest.mark.parametrize("hostile", HOSTILE)
def test_signing_in_with_a_hostile_next_lands_on_the_dashboard(acme, hostile):
    vera(acme)
    browser = Client()
    page = browser.get(reverse("login"), {"next": hostile})
    assert page.status_code == 200
    assert "evil" not in page.content.decode().split('name="next"')[1].split(">")[0]
    answer = browser.post(reverse("login"), {"username": "vera", "password": "correct horse battery", "next": hostile})
    assert answer.status_code == 302 and answer["Location"] == "/"


def test_signing_in_with_a_path_on_this_site_goes_there(acme):
    vera(acme)
    answer = Client().post(
        reverse("login"), {"username": "vera", "password": "correct horse battery", "next": "/runs/?status=ACTIVE"}
    )
    assert answer.status_code == 302 and answer["Location"] == "/runs/?status=ACTIVE"


@pytest.mark.parametrize("hostile", HOSTILE)
def test_signing_out_with_a_hostile_next_lands_on_the_sign_in_page(acme, admin, hostile):
    browser = Browser(admin)
    answer = browser.post(reverse("logout"), {"next": hostile})
    assert answer.status_code == 302 and answer["Location"] == "/accounts/login/"
