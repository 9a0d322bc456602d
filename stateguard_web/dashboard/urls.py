from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path

from stateguard_web.dashboard import (
    agent_map,
    batches,
    export,
    incidents,
    outbox,
    refunds,
    rewinds,
    saved_views,
    views,
)

app_name = "dashboard"

urlpatterns = [
    path("", views.run_list, name="runs"),
    path("runs.csv", export.runs_csv, name="runs_csv"),
    path("views/", saved_views.view_save, name="view_save"),
    path("views/<int:pk>/delete", saved_views.view_delete, name="view_delete"),
    path("runs/<uuid:code>/", views.run_detail, name="run"),
    path("runs/<uuid:code>/approve", views.run_approve, name="approve"),
    path("runs/<uuid:code>/reject", views.run_reject, name="reject"),
    path("runs/<uuid:code>/retry", views.run_retry, name="retry"),
    path("runs/<uuid:code>/compensate", views.run_compensate, name="compensate"),
    path("runs/<uuid:code>/retry-from", rewinds.run_retry_from, name="retry_from"),
    path("runs/<uuid:code>/terminate", views.run_terminate, name="terminate"),
    path("runs/<uuid:code>/resolve", views.run_resolve, name="resolve"),
    path("runs/<uuid:code>/compensations/<int:pk>/retry", views.compensation_retry,
         name="retry_compensation"),
    path("runs/<uuid:code>/effects/<int:pk>/refund", refunds.effect_refund, name="refund"),
    path("batches/new", batches.batch_new, name="batch_new"),
    path("batches/", batches.batch_create, name="batch_create"),
    path("batches/<uuid:code>/", batches.batch_detail, name="batch"),
    path("batches/<uuid:code>/cancel", batches.batch_cancel, name="batch_cancel"),
    path("incidents/", incidents.incident_list, name="incidents"),
    path("inbox/approvals/", views.inbox_approvals, name="inbox_approvals"),
    path("inbox/attention/", views.inbox_attention, name="inbox_attention"),
    path("inbox/counts", views.inbox_counts, name="inbox_counts"),
    path("workers/", views.workers_page, name="workers_page"),
    path("workers/banner", views.workers_banner, name="workers"),
    path("agents/", agent_map.agent_maps, name="agent_maps"),
    path("agents/<str:name>/map", agent_map.agent_map_view, name="agent_map"),
    path("outbox/", outbox.outbox, name="outbox"),
    path("outbox/<str:digest>/", outbox.outbox_message, name="outbox_message"),
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
]
