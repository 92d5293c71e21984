"""Credential leases: one revoked after it was seen in a build log, which refused a dispatch;
and live ones for an admin to preview and revoke in the console, one operation authorized
under them and not yet dispatched."""

import contextlib

from console.demo.acting import Acting
from ledger.errors import Denied
from ledger.services.authority.credential_leases import credential_lease_issue, credential_lease_revoke
from ledger.services.authority.credentials import credential_create
from ledger.services.fence import operations


def revoked(acting: Acting) -> None:
    """A revoked credential lease that refused a dispatch (DENY_REVOKED)."""
    credential_create(tenant=acting.tenant, principal="github-bot", secret_ref="vault:kv/github-bot")  # noqa: S106 - a reference, not a secret
    run, token = acting.leased("demo-revoked")
    lease = credential_lease_issue(
        worker=acting.worker,
        run_id=run.pk,
        fencing_token=token,
        principal="github-bot",
        actions=["push"],
        resources=["repo:acme/web"],
        ttl_s=3600,
    )
    op = acting.intend(run, token, "demo:push:5", tool="git", action="push", resource="repo:acme/web")
    operations.operation_authorize(
        worker=acting.worker, operation_id=op.pk, fencing_token=token, credential_lease_id=lease.pk
    )
    credential_lease_revoke(
        tenant=acting.tenant, lease_id=lease.pk, revoked_by="admin", reason="token seen in a build log"
    )
    with contextlib.suppress(Denied):  # DENY_REVOKED, as intended
        operations.operation_dispatch(worker=acting.worker, operation_id=op.pk, fencing_token=token)


def live(acting: Acting) -> None:
    """Two live leases of the deploy bot, and a release authorized under the first."""
    credential_create(tenant=acting.tenant, principal="deploy-bot", secret_ref="vault:kv/deploy-bot")  # noqa: S106 - a reference, not a secret
    run, token = acting.leased("demo-deploy")
    issued = [
        credential_lease_issue(
            worker=acting.worker,
            run_id=run.pk,
            fencing_token=token,
            principal="deploy-bot",
            actions=["release"],
            resources=[resource],
            ttl_s=3600,
        )
        for resource in ("service:web", "service:api")
    ]
    op = acting.intend(run, token, "demo:release:9", tool="deploy", action="release", resource="service:web")
    operations.operation_authorize(
        worker=acting.worker, operation_id=op.pk, fencing_token=token, credential_lease_id=issued[0].pk
    )
