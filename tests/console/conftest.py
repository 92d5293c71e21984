"""Console fixtures: users with a role on a tenant (django-guardian, through role_grant),
logged-in test clients, and fast builders of many runs."""

import uuid
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from ledger.models import Run, RunLease
from ledger.services.tenancy.roles import role_grant


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def viewer(acme):
    user, _ = role_grant(username="vera", tenant=acme.tenant, role="viewer")
    return user


@pytest.fixture
def viewer_client(viewer):
    return logged_in(viewer)


@pytest.fixture
def roleless_client(acme, outsider, django_user_model):
    """A signed-in user with no role anywhere."""
    return logged_in(django_user_model.objects.create_user(username="nobody"))


@pytest.fixture
def outsider_viewer_client(outsider):
    """A viewer of the other tenant (globex) only."""
    user, _ = role_grant(username="gus", tenant=outsider.tenant, role="viewer")
    return logged_in(user)


def bulk_runs(tenant, count: int, *, start=None, **fields) -> list[Run]:
    """``count`` runs (each with its lease row) one second apart, newest last: many rows
    fast, for pagination and query-count tests."""
    start = start or timezone.now() - timedelta(days=1)
    runs = Run.objects.bulk_create(
        [Run(id=uuid.uuid4(), tenant=tenant, schema_version=1, **fields) for _ in range(count)]
    )
    # created_at is auto_now_add: set distinct times afterwards, one per run.
    for i, run in enumerate(runs):
        run.created_at = start + timedelta(seconds=i)
    Run.objects.bulk_update(runs, ["created_at"])
    RunLease.objects.bulk_create([RunLease(run=run, schema_version=1) for run in runs])
    return runs
