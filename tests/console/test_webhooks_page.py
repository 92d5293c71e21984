"""The tenant's webhooks page: admins manage endpoints (create, change, disable, rotate) and
read the delivery log; every other role is refused (403), another tenant's page is a 404; a
bad form is refused naming its field and writes nothing; a signing secret is shown once,
uncached, and never again."""

import pytest
from django.urls import reverse

from ledger.models import AdminAction, WebhookDelivery, WebhookEndpoint
from ledger.models.notifications import DeliveryStatus
from ledger.services.notifications.targets import signing_secret
from tests.factories import webhook_endpoint
from tests.helpers import Browser

KINDS = ["quarantine", "chain_broken"]


def page(slug: str = "acme") -> str:
    return reverse("tenant-webhooks", args=[slug])


def form(**overrides) -> dict:
    return {
        "name": "ops",
        "target": "https://hooks.example.com/fenceline",
        "kinds": KINDS,
        "unknown_after_min": "20",
        "reason": "page the on-call",
        **overrides,
    }


@pytest.fixture
def admin_browser(admin):
    return Browser(admin)


def endpoint(tenant, name: str = "ops"):
    return webhook_endpoint(tenant, "https://hooks.example.com/x", KINDS, name).endpoint


# --- permissions -------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["viewer", "operator", "approver"])
def test_every_role_but_admin_is_refused_the_page_and_its_actions(acme, people, role):
    made = endpoint(acme.tenant)
    browser = Browser(people[role])
    assert browser.get(page()).status_code == 403
    assert browser.post(reverse("tenant-webhook-create", args=["acme"]), form(name="other")).status_code == 403
    rotate = reverse("tenant-webhook-rotate", args=["acme", made.pk])
    assert browser.post(rotate, {"reason": "mine now"}).status_code == 403
    disable = reverse("tenant-webhook-enabled", args=["acme", made.pk])
    assert browser.post(disable, {"enabled": "off", "reason": "quiet"}).status_code == 403
    made.refresh_from_db()
    assert (made.key_version, made.enabled, WebhookEndpoint.objects.count()) == (1, True, 1)
    # The tenant page offers no link to it either.
    assert page() not in browser.get(reverse("tenant_detail", args=["acme"])).content.decode()


def test_an_admin_sees_endpoints_and_the_delivery_log_newest_first(acme, admin_browser):
    made = endpoint(acme.tenant)
    for i, status in enumerate([DeliveryStatus.DELIVERED, DeliveryStatus.GAVE_UP]):
        WebhookDelivery.objects.create(
            endpoint=made,
            tenant=acme.tenant,
            kind="quarantine",
            dedupe_key=f"k{i}",
            status=status,
            attempts=i + 1,
            last_status_code=500 if i else 200,
            last_error="http_500" if i else "",
            next_attempt_at=made.created_at,
            created_at=made.created_at.replace(microsecond=i),
        )
    answer = admin_browser.get(page())
    body = answer.content.decode()
    assert answer.status_code == 200
    assert "ops" in body and "https://hooks.example.com/…" in body  # the host, not the path
    assert [d.status for d in answer.context["deliveries"]] == ["GAVE_UP", "DELIVERED"]
    assert "http_500" in body
    assert page() in admin_browser.get(reverse("tenant_detail", args=["acme"])).content.decode()


def test_another_tenants_page_and_endpoints_are_404(acme, outsider, admin_browser):
    theirs = endpoint(outsider.tenant, name="theirs")
    assert admin_browser.get(page("globex")).status_code == 404
    assert admin_browser.post(reverse("tenant-webhook-create", args=["globex"]), form()).status_code == 404
    # Their endpoint's id under our tenant's URL is not found either.
    assert (
        admin_browser.post(reverse("tenant-webhook-rotate", args=["acme", theirs.pk]), {"reason": "x"}).status_code
        == 404
    )
    theirs.refresh_from_db()
    assert theirs.key_version == 1


# --- forms -------------------------------------------------------------------------------


def test_creating_shows_the_secret_once_uncached_and_records_the_decision(acme, admin_browser):
    answer = admin_browser.post(reverse("tenant-webhook-create", args=["acme"]), form())
    assert answer.status_code == 201
    made = WebhookEndpoint.objects.get(tenant=acme.tenant)
    secret = signing_secret(endpoint_id=made.pk, key_id=made.key_id, key_version=made.key_version)
    assert secret in answer.content.decode()
    assert answer["Cache-Control"] == "no-store"
    assert (made.kinds, made.unknown_after_s, made.created_by) == (KINDS, 1200, "user:ada")
    action = AdminAction.objects.get(action="webhook.create")
    assert action.actor == "user:ada" and action.reason == "page the on-call"
    assert action.fields["target_host"] == "hooks.example.com"
    assert secret not in admin_browser.get(page()).content.decode()  # never shown again


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"name": ""}, "name"),
        ({"kinds": []}, "kinds"),
        ({"kinds": ["everything"]}, "kinds"),
        ({"unknown_after_min": "0"}, "unknown after min"),
        ({"target": "ftp://example.com/x"}, "target"),
        ({"target": "http://example.com/x"}, "target"),  # http only to a host the operator allows
        ({"target": "https://user:pw@example.com/x"}, "target"),
        ({"target": "https://example.com/x?token=abcdef123456"}, "target"),  # a credential in the URL
        ({"target": "ref:not-configured"}, "target"),
        ({"reason": ""}, "reason"),
    ],
)
def test_a_bad_form_is_refused_naming_its_field_and_writes_nothing(acme, admin_browser, overrides, field):
    answer = admin_browser.post(reverse("tenant-webhook-create", args=["acme"]), form(**overrides))
    assert answer.status_code == 422
    body = answer.content.decode()
    assert field in " ".join(answer.context["errors"]) or answer.context["error_field"] == field
    assert "abcdef123456" not in body and "pw@" not in body  # a refused value is not echoed
    assert WebhookEndpoint.objects.count() == 0
    assert not AdminAction.objects.filter(action__startswith="webhook.").exists()


def test_a_duplicate_name_is_refused_on_the_name(acme, admin_browser):
    endpoint(acme.tenant)
    answer = admin_browser.post(reverse("tenant-webhook-create", args=["acme"]), form())
    assert answer.status_code == 422
    assert answer.context["error_field"] == "name"
    assert WebhookEndpoint.objects.count() == 1


def test_an_admin_changes_disables_and_rotates(acme, admin_browser):
    made = endpoint(acme.tenant)
    change = reverse("tenant-webhook-update", args=["acme", made.pk])
    answer = admin_browser.post(
        change, {"kinds": ["breaker_change"], "unknown_after_min": "30", "reason": "fewer pages"}
    )
    assert answer.status_code == 302
    made.refresh_from_db()
    assert (made.kinds, made.unknown_after_s, made.target) == (["breaker_change"], 1800, "https://hooks.example.com/x")

    WebhookDelivery.objects.create(
        endpoint=made,
        tenant=acme.tenant,
        kind="quarantine",
        dedupe_key="k",
        next_attempt_at=made.created_at,
        created_at=made.created_at,
    )
    disable = reverse("tenant-webhook-enabled", args=["acme", made.pk])
    assert admin_browser.post(disable, {"enabled": "off", "reason": "endpoint moved"}).status_code == 302
    made.refresh_from_db()
    assert not made.enabled
    assert WebhookDelivery.objects.get().last_error == "disabled"

    rotate = reverse("tenant-webhook-rotate", args=["acme", made.pk])
    answer = admin_browser.post(rotate, {"reason": "rotation drill"})
    made.refresh_from_db()
    assert answer.status_code == 200 and made.key_version == 2
    assert signing_secret(endpoint_id=made.pk, key_id=made.key_id, key_version=2) in answer.content.decode()
    assert answer["Cache-Control"] == "no-store"
    assert list(
        AdminAction.objects.filter(action__startswith="webhook.")
        .order_by("occurred_at")
        .values_list("action", flat=True)
    ) == ["webhook.create", "webhook.update", "webhook.disable", "webhook.rotate_secret"]

    assert admin_browser.post(rotate, {"reason": ""}).status_code == 422  # a reason is required
    made.refresh_from_db()
    assert made.key_version == 2
