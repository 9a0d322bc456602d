"""The roles: Django groups made of the journal's permissions (migration 0002 creates them).

A site may also grant the permissions one by one; ``access`` reads permissions, never group
names, so a user with ``sagas.operate_run`` granted directly is an operator all the same.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["ROLES", "Role"]


class Role(StrEnum):
    VIEWER = "viewer"  # reads every run
    SUBMITTER = "submitter"  # submits runs, reads the runs it submitted
    OPERATOR = "operator"  # reads every run, and acts on them


# The permissions (app_label.codename) of each role. Migration 0002 holds its own copy, as
# migrations must: change both together, in a new migration. payments.refund_effect is given
# to operators by payments' migration 0002 (payments depends on accounts, not the reverse).
ROLES: dict[Role, tuple[str, ...]] = {
    Role.VIEWER: ("sagas.view_run",),
    Role.SUBMITTER: ("sagas.submit_run",),
    Role.OPERATOR: ("sagas.view_run", "sagas.operate_run", "payments.refund_effect"),
}
