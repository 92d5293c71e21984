from django.contrib import admin
from django.urls import include, path

from approvals.api import router as approvals_api
from console.views import (
    account,
    activity,
    approvals,
    cases,
    credentials,
    dashboard,
    lists,
    probes,
    resources,
    runs,
    site,
    tenants,
    upgrades,
    webhooks,
    workers,
)
from ledger.api import api

# The worker API: the ledger's calls, and the approvals app's (a worker asks how a person
# decided). Added before api.urls is read below.
api.add_router("", approvals_api)

urlpatterns = [
    # The worker API first: its requests are the most frequent, and Django tries the
    # patterns in order.
    path("api/v1/", api.urls),
    path("", dashboard.home, name="home"),
    path("healthz", probes.healthz, name="healthz"),
    path("readyz", probes.readyz, name="readyz"),
    path("readyz/jobs", probes.readyz_jobs, name="readyz-jobs"),
    path("metrics", probes.metrics_view, name="metrics"),
    path("favicon.ico", site.favicon, name="favicon"),
    path("activity/", activity.activity, name="activity"),
    path("views/save", lists.save_view, name="saved-view-save"),
    path("views/<int:view_id>/delete", lists.delete_view, name="saved-view-delete"),
    path("runs/", runs.run_list, name="runs"),
    path("runs/<uuid:run_id>/", runs.run_detail, name="run_detail"),
    path("runs/<uuid:run_id>/cancel", runs.run_cancel_view, name="run-cancel"),
    path("runs/<uuid:run_id>/force-release", runs.run_force_release_view, name="run-force-release"),
    path("runs/<uuid:run_id>/operations/<uuid:operation_id>/retry", runs.operation_retry_view, name="operation-retry"),
    path("runs/<uuid:run_id>/chain.json", runs.run_export, name="run-export"),
    path("runs/<uuid:run_id>/events/<int:seq>/payload", runs.event_payload, name="event-payload"),
    path("runs/<uuid:run_id>/verify", runs.run_verify_now, name="run-verify"),
    path("resources/", resources.resource_list, name="resources"),
    path("resources/<uuid:resource_id>/act", resources.resource_act, name="resource-act"),
    path("cases/", cases.queue, name="cases"),
    path("cases/bulk", cases.bulk, name="cases-bulk"),
    path("cases/<uuid:case_id>/claim", cases.claim, name="case-claim"),
    path("cases/<uuid:case_id>/resolve", cases.resolve, name="case-resolve"),
    path("cases/<uuid:case_id>/escalate", cases.escalate, name="case-escalate"),
    path("cases/<uuid:case_id>/unclaim", cases.unclaim, name="case-unclaim"),
    path("cases/<uuid:case_id>/reassign", cases.reassign, name="case-reassign"),
    path("cases/<uuid:case_id>/comment", cases.comment, name="case-comment"),
    path("approvals/", approvals.queue, name="approvals"),
    path("approvals/bulk", approvals.bulk, name="approvals-bulk"),
    path("approvals/<uuid:approval_id>/decide", approvals.decide, name="approval-decide"),
    path("credentials/", credentials.lease_list, name="credentials"),
    path("credentials/revoke", credentials.revoke_preview, name="credential-revoke-preview"),
    path("credentials/revoke/confirm", credentials.revoke, name="credential-revoke"),
    path("credentials/rotate", credentials.rotate, name="credential-rotate"),
    path("upgrades/", upgrades.upgrades, name="upgrades"),
    path("upgrades/conflicts/<int:conflict_id>/resolve", upgrades.conflict_decide, name="upgrades-conflict-resolve"),
    path("upgrades/tenants/<slug:slug>/allow-effects", upgrades.allow_effects, name="upgrades-allow-effects"),
    path("workers/", workers.worker_list, name="workers"),
    path("workers/drain", workers.bulk_drain, name="workers-drain"),
    path("workers/<int:worker_id>/", workers.worker_detail, name="worker_detail"),
    path("workers/<int:worker_id>/act", workers.worker_act, name="worker-act"),
    path("tenants/", tenants.tenant_list, name="tenants"),
    path("tenants/<slug:slug>/", tenants.tenant_detail, name="tenant_detail"),
    path("tenants/<slug:slug>/policy", tenants.change_policy, name="tenant-policy"),
    path("tenants/<slug:slug>/grant", tenants.grant_role, name="tenant-grant"),
    path("tenants/<slug:slug>/runbooks", tenants.set_runbook, name="tenant-runbook"),
    path("tenants/<slug:slug>/contracts", tenants.put_contract, name="tenant-contract-put"),
    path("tenants/<slug:slug>/contracts/remove", tenants.remove_contract, name="tenant-contract-remove"),
    path("tenants/<slug:slug>/unknown-tools", tenants.set_unknown_tool_class, name="tenant-unknown-tool-class"),
    path("tenants/<slug:slug>/webhooks/", webhooks.webhooks_page, name="tenant-webhooks"),
    path("tenants/<slug:slug>/webhooks/create", webhooks.webhook_create, name="tenant-webhook-create"),
    path(
        "tenants/<slug:slug>/webhooks/<uuid:endpoint_id>/update", webhooks.webhook_update, name="tenant-webhook-update"
    ),
    path(
        "tenants/<slug:slug>/webhooks/<uuid:endpoint_id>/enabled",
        webhooks.webhook_set_enabled,
        name="tenant-webhook-enabled",
    ),
    path(
        "tenants/<slug:slug>/webhooks/<uuid:endpoint_id>/rotate", webhooks.webhook_rotate, name="tenant-webhook-rotate"
    ),
    path("settings/", account.settings_page, name="my-settings"),
    path("settings/route", account.route_save, name="my-route"),
    path("accounts/login/", site.SignIn.as_view(), name="login"),
    path("accounts/logout/", site.SignOut.as_view(), name="logout"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
]
