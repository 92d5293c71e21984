from django.contrib import admin
from django.urls import include, path

from console.views import dashboard
from ledger.api import api

urlpatterns = [
    path("", dashboard.home, name="home"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/v1/", api.urls),
    path("admin/", admin.site.urls),
]
