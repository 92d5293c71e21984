from django.contrib import admin
from django.urls import include, path

from console.views import approvals, cases, dashboard, runs
from ledger.api import api

urlpatterns = [
    path("", dashboard.home, name="home"),
    path("runs/", runs.run_list, name="runs"),
    path("runs/<uuid:run_id>/", runs.run_detail, name="run_detail"),
    path("cases/", cases.queue, name="cases"),
    path("cases/bulk", cases.bulk, name="cases-bulk"),
    path("cases/<uuid:case_id>/claim", cases.claim, name="case-claim"),
    path("cases/<uuid:case_id>/resolve", cases.resolve, name="case-resolve"),
    path("cases/<uuid:case_id>/escalate", cases.escalate, name="case-escalate"),
    path("approvals/", approvals.queue, name="approvals"),
    path("approvals/<uuid:approval_id>/decide", approvals.decide, name="approval-decide"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/v1/", api.urls),
    path("admin/", admin.site.urls),
]
