"""Approval gates.

A gated step (a node, or one tool call) pauses *before* its body until an operator decides:
``guard.approve`` / ``guard.reject`` write the decision to the journal and resume the run. A
resume value never opens a gate, however many are sent (``Command(resume=...)`` by hand, in any
form): LangGraph hands the n-th resume value of a task to its n-th ``interrupt()``, so the gate
asks the journal after each one and pauses again while the approval is pending.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langgraph.types import interrupt

from stateguard.blame import tag_node
from stateguard.events import Event, emit
from stateguard.exceptions import ApprovalRejected
from stateguard.records import ApprovalRecord, ApprovalStatus

if TYPE_CHECKING:
    from stateguard.core import GuardCore

def approval_gate(core: GuardCore, run_id: str, step_id: str, name: str,
                  payload: dict[str, Any]) -> None:
    """Pause before the step ``step_id`` until its approval is decided; return if approved,
    raise ``ApprovalRejected`` if rejected. ``payload`` is what the operator sees."""
    journal = core.journal
    approval = journal.approval_request(ApprovalRecord(run_id, step_id, name, payload=payload))
    if approval.status == ApprovalStatus.PENDING:
        emit(core.on_event, Event("approval.requested", run_id, name, step_id,
                                  {"payload": approval.payload}))
    request: dict[str, Any] = {"stateguard": "approval", "run_id": run_id, "node": name,
                               "step_id": step_id}
    while approval.status == ApprovalStatus.PENDING:
        interrupt(request)
        # Reached only for a resume value sent by hand (guard.approve decides first, then
        # resumes): the journal, not the value, decides; pending, the next interrupt pauses.
        approval = next((a for a in journal.approvals(run_id) if a.step_id == step_id),
                        approval)
        request = {**request, "still_pending": True}
    if approval.status == ApprovalStatus.REJECTED:
        raise tag_node(ApprovalRejected(name, by=approval.decided_by, reason=approval.reason),
                       name)
