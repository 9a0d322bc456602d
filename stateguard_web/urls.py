from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from stateguard_web.api.api import api
from stateguard_web.dashboard import views as dashboard_views
from stateguard_web.monitoring import health, healthz, metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    # Before the API's "api/": a plain view, no credentials (load balancers call it).
    path("api/health", health.health, name="health"),
    path("api/", api.urls),
    path("healthz", healthz.healthz, name="healthz"),
    path("favicon.ico", dashboard_views.favicon, name="favicon"),
    path("metrics", metrics.metrics, name="metrics"),
    # Last: the dashboard's pages, from the site's root (its home page is the runs list).
    path("", include("stateguard_web.dashboard.urls")),
]
