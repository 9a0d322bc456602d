"""The REST API at /api/: one NinjaAPI, a Router per concern, one exception map.

OpenAPI at /api/openapi.json, interactive docs at /api/docs (docs/api.md says it in words).
"""

from __future__ import annotations

import functools

from ninja import NinjaAPI
from ninja.operation import Operation

from stateguard_web.api import (
    agents,
    batches,
    compensations,
    errors,
    incidents,
    runs,
    webhooks,
    workers,
)
from stateguard_web.api.auth import KeyAuth, SessionAuth


class StateGuardAPI(NinjaAPI):
    def get_openapi_operation_id(self, operation: Operation) -> str:
        return operation.view_func.__name__  # submit_run, list_runs, ... (unique here)


api = StateGuardAPI(
    title="StateGuard API",
    version="1.0",
    description=("Submit runs of the agents StateGuard supervises, read them, and act on "
                 "them as an operator. Authenticate with `Authorization: Bearer <API key>` "
                 "or a logged-in session (with the CSRF token on unsafe methods). Errors are "
                 '`{"detail": ..., "code": ...}`; see docs/api.md.'),
    auth=[KeyAuth(), SessionAuth()],
    parser=errors.JsonParser(),
    urls_namespace="api",
)
errors.install(api)
api.add_decorator(functools.partial(errors.limit_body, api=api), mode="view")
api.add_router("/runs", runs.router)
api.add_router("/agents", agents.router)
api.add_router("/compensations", compensations.router)
api.add_router("/batches", batches.router)
api.add_router("/incidents", incidents.router)
api.add_router("/webhooks", webhooks.router)
api.add_router("", workers.router)  # /api/workers, /api/queue
