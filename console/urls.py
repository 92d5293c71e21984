from django.contrib import admin
from django.urls import path

from console import views
from ledger.api import api

urlpatterns = [
    path("", views.home, name="home"),
    path("api/v1/", api.urls),
    path("admin/", admin.site.urls),
]
