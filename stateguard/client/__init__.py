"""A Python client of StateGuard's REST API (docs/api.md): ``pip install 'stateguard[client]'``.

::

    from stateguard.client import Client

    with Client(base_url="https://stateguard.example.com", api_key=KEY) as sg:
        run = sg.submit("checkout", {"email": "a@b.co", "amount": 4200},
                        idempotency_key="order-42")
        done = sg.wait(run.code, timeout=300)     # follows the run's events until it stops
        print(done.status, [s.node for s in done.steps])

``AsyncClient`` is the same, awaited. Results are dataclasses (``Run``, ``RunDetail``,
``RunPage``, ``Event``...). A submission carries an idempotency key (one is made when none is
given), so it is sent again safely after a lost answer; reads too; operator actions only when
they surely never arrived. ``events(code)`` follows a run's Server-Sent Events
(``GET /api/runs/{code}/events``) and resumes a cut connection where it was cut; ``wait`` uses
them, and polls a server that has none.

Errors, each an exception of its own::

    ClientError                  anything this client raises
    ├── APIError                 the API answered an error: status, code, detail, errors
    │   ├── NotAuthenticated     401 not_authenticated
    │   ├── PermissionDenied     403 permission_denied (csrf_failed)
    │   ├── NotFound             404 not_found
    │   ├── NotAllowedNow        409 not_allowed_now
    │   ├── InvalidRequest       400, 413, 422 invalid
    │   │   └── IdempotencyConflict   422 idempotency_conflict
    │   ├── Throttled            429 throttled (retry_after)
    │   └── ServerError          5xx
    ├── ConnectionFailed         no answer, after the retries
    └── WaitTimeout              wait() ran out of time (a TimeoutError too)
"""

from __future__ import annotations

from stateguard.client._async import AsyncClient
from stateguard.client._errors import (
    APIError,
    ClientError,
    ConnectionFailed,
    IdempotencyConflict,
    InvalidRequest,
    NotAllowedNow,
    NotAuthenticated,
    NotFound,
    PermissionDenied,
    ServerError,
    Throttled,
    WaitTimeout,
)
from stateguard.client._models import (
    Agent,
    Approval,
    Attempt,
    AuditEntry,
    Compensation,
    Effect,
    Event,
    Invariant,
    Request,
    Run,
    RunDetail,
    RunPage,
    Step,
)
from stateguard.client._sync import Client

__all__ = [
    "APIError",
    "Agent",
    "Approval",
    "AsyncClient",
    "Attempt",
    "AuditEntry",
    "Client",
    "ClientError",
    "Compensation",
    "ConnectionFailed",
    "Effect",
    "Event",
    "IdempotencyConflict",
    "InvalidRequest",
    "Invariant",
    "NotAllowedNow",
    "NotAuthenticated",
    "NotFound",
    "PermissionDenied",
    "Request",
    "Run",
    "RunDetail",
    "RunPage",
    "ServerError",
    "Step",
    "Throttled",
    "WaitTimeout",
]
