"""Credentials: a principal whose secret lives elsewhere (a vault). Fenceline keeps only a
reference to it (``secret_ref``, e.g. ``vault:kv/github-bot``) and a version; the leases that
lend one version to a run are in ``ledger.services.authority.credential_leases``.

* **Create**: version 1; a reference that looks like a secret is refused (422).
* **Rotate** (admin): version + 1 in one UPDATE; every lease on an older version is stale
  from that moment (the authority checks deny it with DENY_STALE_VERSION). Each run holding
  an unrevoked, unexpired lease of the credential gets one CREDENTIAL_ROTATED event.

Every human decision names its user (``user:<name>``) and a reason (invariant 8); names,
reasons, principals and references pass the secret boundary (invariant 6).

Lock order, the same everywhere: the credential row, then runs with their leases
(``locked_runs``), then credential-lease rows. Issuing a lease holds the credential ``FOR
SHARE`` before the fence locks the run; rotating takes it exclusively with its UPDATE
before locking runs. So an issue and a rotation of the same credential serialize without a
deadlock: a lease is either issued on the new version or is visible to the rotation, which
then records CREDENTIAL_ROTATED in its run.
"""

import re
import uuid
from dataclasses import dataclass

from django.contrib.auth.models import AnonymousUser, User
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from ledger.actors import user_actor
from ledger.boundary import check_text
from ledger.errors import InvalidInput, NotFound
from ledger.models import Credential, CredentialLease, Tenant
from ledger.roles import ADMINISTER
from ledger.services.core.decisions import acting_name, admin_action_record, decision_reason
from ledger.services.core.fencing import locked_runs
from ledger.services.evidence.append import ChainBatch

MAX_PRINCIPAL_LENGTH = 200
MAX_SECRET_REF_LENGTH = 300
MAX_USERNAME_LENGTH = 150  # CredentialLease.revoked_by, Django's username

PRINCIPAL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+\-]*")
# A reference names where the secret lives: "<scheme>:<location>", e.g. vault:kv/github-bot,
# aws-sm:prod/deployer, env:GITHUB_BOT. A bare value (no scheme) is refused: it may be the secret.
SECRET_REF = re.compile(r"[a-z][a-z0-9+.\-]{0,31}:[A-Za-z0-9._~/:@+#?=&%\-]+")


# --- checks -------------------------------------------------------------------------------


def principal_check(principal: object) -> str:
    if not isinstance(principal, str) or not 1 <= len(principal) <= MAX_PRINCIPAL_LENGTH:
        raise InvalidInput(f"principal must be 1 to {MAX_PRINCIPAL_LENGTH} characters")
    check_text(principal, path="principal")
    if not PRINCIPAL.fullmatch(principal):
        raise InvalidInput("principal must start with a letter or digit and use only letters, digits and . _ : @ / + -")
    return principal


def _secret_ref(secret_ref: object) -> str:
    if not isinstance(secret_ref, str) or not 1 <= len(secret_ref) <= MAX_SECRET_REF_LENGTH:
        raise InvalidInput(f"secret_ref must be 1 to {MAX_SECRET_REF_LENGTH} characters")
    check_text(secret_ref, path="secret_ref")
    if not SECRET_REF.fullmatch(secret_ref):
        raise InvalidInput(
            "secret_ref must be a reference to where the secret is kept, '<scheme>:<location>' "
            "such as vault:kv/github-bot, never the secret itself"
        )
    return secret_ref


def human_decision(user: object, reason: object) -> tuple[str, str]:
    """The user and reason of a human decision (invariant 8), both through the boundary."""
    if not isinstance(user, str) or not user.strip() or len(user) > MAX_USERNAME_LENGTH or user != user.strip():
        raise InvalidInput(
            f"a decision names its user: 1 to {MAX_USERNAME_LENGTH} characters without surrounding spaces"
        )
    check_text(user, path="user")
    return user, decision_reason(reason)


# --- credentials --------------------------------------------------------------------------


def credential_create(*, tenant: Tenant, principal: str, secret_ref: str) -> Credential:
    """A new credential at version 1. Only the reference is stored, never a secret; a
    reference that looks like a secret is refused (422 FORBIDDEN_FIELD)."""
    principal = principal_check(principal)
    secret_ref = _secret_ref(secret_ref)
    try:
        with transaction.atomic():
            return Credential.objects.create(tenant=tenant, principal=principal, secret_ref=secret_ref, version=1)
    except IntegrityError:
        if Credential.objects.filter(tenant=tenant, principal=principal).exists():
            raise InvalidInput(f"a credential for principal {principal!r} already exists in this tenant") from None
        raise


@dataclass(frozen=True)
class CredentialRotation:
    """A credential at its new version, and the runs that got its CREDENTIAL_ROTATED event."""

    credential: Credential
    affected_run_ids: list[uuid.UUID]


def credential_rotate(
    *,
    tenant: Tenant,
    principal: str,
    reason: str,
    rotated_by: str = "",
    user: User | AnonymousUser | None = None,
) -> CredentialRotation:
    """Version + 1. Leases on older versions are stale from now on (the authority checks
    deny them with DENY_STALE_VERSION). Every run holding an unrevoked, unexpired lease of
    the credential gets a CREDENTIAL_ROTATED event, in the same transaction.

    The result names the rotated credential and the runs that got the event.
    Given a console ``user``, their admin role on the tenant is checked and they are named."""
    rotated_by = acting_name(user=user, name=rotated_by, tenant_id=tenant.pk, perm=ADMINISTER)
    rotated_by, reason = human_decision(rotated_by, reason)
    with transaction.atomic():
        now = timezone.now()
        # One conditional UPDATE: the increment happens in the database, under the row lock
        # it takes, so concurrent rotations each get their own version.
        updated = Credential.objects.filter(tenant=tenant, principal=principal).update(
            version=F("version") + 1, rotated_at=now
        )
        if updated != 1:
            raise NotFound("no credential with that principal in this tenant")
        credential = Credential.objects.get(tenant=tenant, principal=principal)
        run_ids = list(
            CredentialLease.objects.filter(credential=credential, revoked_at__isnull=True, expires_at__gt=now)
            .values_list("run_id", flat=True)
            .distinct()
        )
        runs = locked_runs({"run__tenant": tenant, "run_id__in": run_ids}) if run_ids else []
        batch = ChainBatch(now)
        for run in sorted(runs, key=lambda r: str(r.pk)):
            batch.append(
                run,
                "CREDENTIAL_ROTATED",
                actor=user_actor(rotated_by),
                fields={"principal": credential.principal, "version": credential.version, "reason": reason},
            )
        batch.commit()
        admin_action_record(
            tenant=tenant,
            actor=user_actor(rotated_by),
            action="credential.rotate",
            subject=credential.principal,
            reason=reason,
            fields={"version": credential.version, "runs": len(runs)},
            now=now,
        )
    return CredentialRotation(credential=credential, affected_run_ids=[run.pk for run in runs])
