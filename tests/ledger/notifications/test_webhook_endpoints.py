"""The endpoint services: admins only (a console user's role is re-checked here, not only by
the view), every change an AdminAction naming who and why, targets that pass the secret
boundary (a Slack-style URL must be a ref:), a secret derived, not stored, and rotated."""

import pytest

from ledger.errors import Forbidden, InvalidInput, NotFound
from ledger.models import AdminAction, WebhookEndpoint
from ledger.services.notifications.endpoints import (
    endpoint_create,
    endpoint_enable,
    endpoint_rotate_secret,
    endpoint_update,
)
from ledger.services.notifications.targets import signature, target_check, target_url


def create(tenant, **overrides):
    values = {
        "tenant": tenant,
        "name": "ops",
        "target": "https://hooks.example.com/in",
        "kinds": ["quarantine"],
        "reason": "page the on-call",
        "created_by": "alice",
        **overrides,
    }
    return endpoint_create(**values)


@pytest.mark.parametrize("role", ["viewer", "operator", "approver"])
def test_only_an_admin_may_create_change_or_rotate(acme, people, role):
    person = people[role]
    with pytest.raises(Forbidden):
        create(acme.tenant, user=person, created_by="")
    made = create(acme.tenant).endpoint
    with pytest.raises(Forbidden):
        endpoint_rotate_secret(tenant=acme.tenant, endpoint_id=made.pk, reason="mine", user=person)
    with pytest.raises(Forbidden):
        endpoint_update(tenant=acme.tenant, endpoint_id=made.pk, kinds=["chain_broken"], reason="x", user=person)
    made.refresh_from_db()
    assert (made.key_version, made.kinds) == (1, ["quarantine"])


def test_an_admin_of_another_tenant_is_refused_and_their_endpoint_is_not_found(acme, outsider, outsider_admin):
    with pytest.raises(Forbidden):
        create(acme.tenant, user=outsider_admin, created_by="")
    theirs = create(outsider.tenant, name="theirs").endpoint
    with pytest.raises(NotFound):
        endpoint_rotate_secret(tenant=acme.tenant, endpoint_id=theirs.pk, reason="x", changed_by="alice")


def test_every_change_is_an_admin_action_naming_who_and_why(acme, admin):
    made = create(acme.tenant, user=admin, created_by="").endpoint
    endpoint_update(
        tenant=acme.tenant, endpoint_id=made.pk, kinds=["chain_broken", "quarantine"], reason="more", user=admin
    )
    endpoint_enable(tenant=acme.tenant, endpoint_id=made.pk, reason="on again", user=admin)
    endpoint_rotate_secret(tenant=acme.tenant, endpoint_id=made.pk, reason="drill", user=admin)
    actions = list(AdminAction.objects.order_by("occurred_at").values_list("actor", "action", "reason"))
    assert actions[-4:] == [
        ("user:ada", "webhook.create", "page the on-call"),
        ("user:ada", "webhook.update", "more"),
        ("user:ada", "webhook.enable", "on again"),
        ("user:ada", "webhook.rotate_secret", "drill"),
    ]
    made.refresh_from_db()
    assert made.kinds == ["quarantine", "chain_broken"]  # the documented order, each once


SLACK_STYLE = "https://hooks.slack.com/services/T0AB12CD3/B0EF45GH6/abcdefghijklmnopqrstuvwx"


@pytest.mark.parametrize(
    "target",
    [
        SLACK_STYLE,
        "https://user:secret@example.com/in",
        "https://example.com/in?token=abcdef123456",
        "http://example.com/in",
        "ftp://example.com/in",
        "https:///in",
        "ref:",
        "ref:unknown",
        "",
    ],
)
def test_a_target_that_carries_a_secret_or_is_not_https_is_refused(target):
    with pytest.raises(InvalidInput) as refused:
        target_check(target)
    assert refused.value.extra["fields"][0]["field"] == "target"
    assert "abcdef" not in refused.value.detail and "secret@" not in refused.value.detail


def test_a_secret_url_is_stored_only_as_its_reference(acme, settings, monkeypatch):
    monkeypatch.setitem(settings.FENCELINE, "WEBHOOK_TARGETS", {"ops-slack": SLACK_STYLE})
    made = create(acme.tenant, target="ref:ops-slack").endpoint
    assert WebhookEndpoint.objects.get(pk=made.pk).target == "ref:ops-slack"
    assert target_url(made.target) == SLACK_STYLE
    # a host the operator allows (the test settings: 127.0.0.1) may be http
    assert target_check("http://127.0.0.1:8080/hook") == "http://127.0.0.1:8080/hook"


def test_the_secret_is_derived_not_stored_and_a_rotation_changes_it(acme):
    first = create(acme.tenant)
    row = WebhookEndpoint.objects.filter(pk=first.endpoint.pk).values()[0]
    assert first.secret.startswith("whsec_")
    assert first.secret not in repr(row)
    second = endpoint_rotate_secret(tenant=acme.tenant, endpoint_id=first.endpoint.pk, reason="drill", changed_by="a")
    assert second.secret != first.secret and second.endpoint.key_version == 2
    assert not AdminAction.objects.filter(fields__icontains=first.secret).exists()
    assert signature(first.secret, b"{}", 1) != signature(second.secret, b"{}", 1)


def test_names_are_unique_per_tenant_and_checked(acme, outsider):
    create(acme.tenant)
    create(outsider.tenant)  # the same name on another tenant is fine
    with pytest.raises(InvalidInput) as duplicate:
        create(acme.tenant)
    assert duplicate.value.extra["fields"][0]["field"] == "name"
    with pytest.raises(InvalidInput):
        create(acme.tenant, name="password=hunter2")
