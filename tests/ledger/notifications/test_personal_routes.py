"""A person's own route: "my cases" and "my approvals" to a webhook of theirs or an email
address. Targets are judged as tenants' webhook targets are (no internal network); a case
handed to someone, or escalated, reaches only that person (or the tenant's admins), an
approval only the approvers of its own tenant; a route never carries another tenant's case
or approval; sends go through the webhook delivery machinery (signed) or Django's mail."""

import json
from datetime import timedelta

import pytest
from django.core import mail
from django.urls import reverse
from django.utils import timezone

from approvals.services.case_timers import cases_enforce_timers
from approvals.services.cases import case_claim, case_escalate, case_reassign
from approvals.services.notifications import notifications_scan
from ledger.errors import InvalidInput
from ledger.models import PersonalRoute, WebhookDelivery
from ledger.services.notifications.delivery import deliveries_send
from ledger.services.notifications.routes import route_secret, route_set
from ledger.services.notifications.targets import signature
from ledger.services.tenancy.roles import role_grant
from tests.factories import pending_approvals, unknown_case, user_with, webhook_endpoint
from tests.helpers import Browser, Sink, run_concurrently

INTERNAL = [
    "https://169.254.169.254/latest/meta-data/",
    "https://10.0.0.1/",
    "https://localhost/",
    "https://2130706433/",
    "https://[::ffff:a9fe:a9fe]/",
    "http://example.com/",  # http only to a host the operator allows by name
    "ref:slack",  # an operator's name for the tenants' endpoints, not a person's
    "https://user:pw@example.com/",
]
BOTH = ["my_case", "my_approval"]


@pytest.fixture
def nothing_allowed(settings):
    settings.FENCELINE = {**settings.FENCELINE, "WEBHOOK_ALLOWED_HOSTS": frozenset()}


@pytest.fixture
def sink():
    made = Sink((200,))
    yield made
    made.close()


def mailed(user, address=None):
    return route_set(user=user, target=address or f"{user.username}@example.com", kinds=BOTH).route


def routed_to(user) -> list[str]:
    return sorted(WebhookDelivery.objects.filter(route__user=user).values_list("dedupe_key", flat=True))


# --- the target ----------------------------------------------------------------------------


@pytest.mark.parametrize("target", INTERNAL)
def test_an_internal_or_unsigned_target_is_refused_naming_the_field(acme, operator, nothing_allowed, target):
    with pytest.raises(InvalidInput) as refused:
        route_set(user=operator, target=target, kinds=BOTH)
    assert refused.value.extra["fields"][0]["field"] == "target"
    assert not PersonalRoute.objects.exists()


def test_the_settings_form_refuses_an_internal_target_with_422_and_saves_nothing(acme, operator, nothing_allowed):
    page = Browser(operator).post(reverse("my-route"), {"target": "https://169.254.169.254/", "kinds": BOTH})
    assert page.status_code == 422 and "not a public address" in page.content.decode()
    assert not PersonalRoute.objects.exists()


@pytest.mark.parametrize("target", ["not-an-address@", "a@b@c", "x" * 600 + "@example.com"])
def test_a_bad_email_address_is_refused(acme, operator, target):
    with pytest.raises(InvalidInput):
        route_set(user=operator, target=target, kinds=BOTH)


def test_a_public_https_url_is_kept_and_its_secret_shown_once_on_the_page(acme, operator, nothing_allowed):
    page = Browser(operator).post(reverse("my-route"), {"target": "https://93.184.215.14/hook", "kinds": BOTH})
    route = PersonalRoute.objects.get(user=operator)
    assert page.status_code == 201 and route_secret(route) in page.content.decode()
    assert route.target == "https://93.184.215.14/hook" and route.kinds == BOTH
    # The next view of the page shows where, never the secret again.
    again = Browser(operator).get(reverse("my-settings")).content.decode()
    assert "93.184.215.14" in again and route_secret(route) not in again


def test_an_email_address_is_kept_as_mailto_and_an_empty_target_keeps_it(acme, operator):
    route_set(user=operator, target="olga@example.com", kinds=BOTH)
    route_set(user=operator, target="", kinds=["my_case"])
    route = PersonalRoute.objects.get(user=operator)
    assert route.target == "mailto:olga@example.com" and route.kinds == ["my_case"]
    route_set(user=operator, target="", kinds=[], remove=True)
    assert not PersonalRoute.objects.exists()


# --- who is told -----------------------------------------------------------------------------


def test_a_reassigned_case_is_routed_to_the_person_it_was_handed_to_only(acme, operator, admin):
    other = user_with("operator", acme.tenant, "otto")
    for person in (operator, admin, other):
        mailed(person)
    case = unknown_case(acme.worker)
    case_reassign(case_id=case.pk, user=operator, to="otto", reason="you know this provider")
    assert [k.split(":")[:3] for k in routed_to(other)] == [["mycase", str(case.pk), "reassigned"]]
    assert routed_to(operator) == [] and routed_to(admin) == []
    body = WebhookDelivery.objects.get(route__user=other).body
    assert "was handed to you by olga: you know this provider" in body["text"]
    assert body["fenceline"]["tenant"] == "acme" and body["fenceline"]["subject"]["case_id"] == str(case.pk)


def test_claiming_a_case_yourself_sends_nothing(acme, operator):
    mailed(operator)
    case_claim(case_id=unknown_case(acme.worker).pk, user=operator)
    assert not WebhookDelivery.objects.exists()


def test_an_escalated_case_is_routed_to_the_tenants_admins_not_to_the_escalator(acme, operator, admin, approver):
    for person in (operator, admin, approver):
        mailed(person)
    case = unknown_case(acme.worker)
    case_escalate(case_id=case.pk, user=operator, reason="the provider's status page shows an incident")
    assert len(routed_to(admin)) == 1 and routed_to(operator) == [] and routed_to(approver) == []


def test_a_case_the_timers_escalate_is_routed_to_the_tenants_admins(
    acme, operator, admin, django_capture_on_commit_callbacks
):
    for person in (operator, admin):
        mailed(person)
    unknown_case(acme.worker)
    with django_capture_on_commit_callbacks(execute=True):  # routed once the escalation commits
        assert cases_enforce_timers(now=timezone.now() + timedelta(hours=3)).escalated == 1
    assert len(routed_to(admin)) == 1 and routed_to(operator) == []
    delivery = WebhookDelivery.objects.get(route__user=admin)
    assert "escalated by the case timers" in json.dumps(delivery.body)


def test_a_route_that_does_not_ask_for_cases_gets_none(acme, operator, admin):
    route_set(user=admin, target="ada@example.com", kinds=["my_approval"])
    case_escalate(case_id=unknown_case(acme.worker).pk, user=operator, reason="incident")
    assert not WebhookDelivery.objects.exists()


def test_an_approval_is_routed_to_the_approvers_of_its_tenant_only(acme, outsider, approver, operator, viewer):
    other_approver = user_with("approver", outsider.tenant, "gail")
    for person in (approver, operator, viewer, other_approver):
        mailed(person)
    (approval,) = pending_approvals(acme.worker)
    first = notifications_scan()
    assert routed_to(approver) == [f"myapproval:{approval.pk}"]
    assert routed_to(operator) == routed_to(viewer) == routed_to(other_approver) == []
    assert first.by_kind == {"my_approval": 1}
    assert notifications_scan().created == 0  # once per approval and route


def test_a_route_never_carries_another_tenants_case_or_approval(acme, outsider, outsider_admin):
    """gus administers globex only: acme's escalations and approvals never reach his route,
    nor does a reassignment to him on acme (he could not take it)."""
    mailed(outsider_admin)
    acme_admin = user_with("admin", acme.tenant, "ada")
    case = unknown_case(acme.worker)
    with pytest.raises(InvalidInput):
        case_reassign(case_id=case.pk, user=acme_admin, to="gus", reason="r")
    case_escalate(case_id=case.pk, user=acme_admin, reason="incident")
    pending_approvals(acme.worker)
    notifications_scan()
    assert routed_to(outsider_admin) == []


def test_a_role_taken_away_stops_the_routing(acme, approver, admin):
    mailed(approver)
    role_grant(username="alice", tenant=acme.tenant, role="viewer", user=admin, reason="moved teams")
    pending_approvals(acme.worker)
    notifications_scan()
    assert routed_to(approver) == []


def test_personal_deliveries_stay_out_of_the_tenants_webhook_log(acme, approver, admin):
    webhook_endpoint(acme.tenant, kinds=["approval_pending"])
    mailed(approver)
    pending_approvals(acme.worker)
    notifications_scan()
    page = Browser(admin).get(reverse("tenant-webhooks", args=["acme"]))
    assert [d.route_id for d in page.context["deliveries"]] == [None]


# --- how it is sent ----------------------------------------------------------------------------


def test_an_email_route_is_sent_through_djangos_mail(acme, approver):
    mailed(approver, "alice@example.com")
    pending_approvals(acme.worker)
    notifications_scan()
    assert deliveries_send().delivered == 1
    (message,) = mail.outbox
    assert message.to == ["alice@example.com"] and "Approval awaits you: payments.charge" in message.subject
    assert "/approvals/" in message.body
    assert WebhookDelivery.objects.get().status == "DELIVERED"


def test_a_webhook_route_is_sent_signed_with_its_own_secret(acme, approver, sink):
    route = route_set(user=approver, target=sink.url("/mine"), kinds=BOTH).route
    pending_approvals(acme.worker)
    notifications_scan()
    assert deliveries_send().delivered == 1
    (request,) = sink.requests
    assert request["path"] == "/mine"
    stamp = request["headers"]["Fenceline-Signature"].split(",")[0].removeprefix("t=")
    assert request["headers"]["Fenceline-Signature"] == signature(route_secret(route), request["body"], int(stamp))
    assert json.loads(request["body"])["fenceline"]["kind"] == "my_approval"


def test_a_route_to_an_address_refused_at_send_gives_up_and_sends_nothing(acme, approver, sink, settings):
    route_set(user=approver, target=sink.url(), kinds=BOTH)
    settings.FENCELINE = {**settings.FENCELINE, "WEBHOOK_ALLOWED_HOSTS": frozenset()}  # allowance withdrawn
    pending_approvals(acme.worker)
    notifications_scan()
    deliveries_send()
    delivery = WebhookDelivery.objects.get()
    assert delivery.status == "GAVE_UP" and delivery.last_error == "refused_address" and sink.requests == []


@pytest.mark.django_db(transaction=True)
def test_scans_at_once_route_each_approval_once(acme):
    approver = user_with("approver", acme.tenant, "alice")
    mailed(approver)
    pending_approvals(acme.worker, 6)
    results = run_concurrently(lambda i: notifications_scan(), 4)
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert sum(r.by_kind.get("my_approval", 0) for r in results) == 6
    assert len(routed_to(approver)) == 6
