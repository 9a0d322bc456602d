"""A run's timeline from its journal rows (runs/timeline.py) and its picture
(dashboard/timeline_svg.py): lanes, durations, parallel steps and tool calls, approvals' waits,
compensations with their attempts, steps in doubt. Unsaved rows, no database."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from stateguard.tool_calls import TOOL_TAG
from stateguard_web.dashboard import timeline_svg
from stateguard_web.runs import timeline
from stateguard_web.sagas.models import (
    Approval,
    Compensation,
    CompensationAttempt,
    Run,
    Step,
)

T0 = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def run(status: str = Run.Status.SUCCEEDED, **extra: Any) -> Run:
    return Run(pk=1, agent="provision", status=status, created_at=at(0), updated_at=at(60),
               **extra)


def step(node: str, start: float, end: float | None, status: str = Step.Status.SUCCEEDED,
         pk: int = 0, **extra: Any) -> Step:
    return Step(pk=pk or int(start * 10) + 1, step_id=f"t-{node}-{start}", node=node,
                status=status, started_at=at(start),
                finished_at=None if end is None else at(end), **extra)


def undo(of: Step, created: float, status: str, attempts: list[tuple[float, float, bool]],
         pk: int = 1, **extra: Any) -> tuple[Compensation, list[CompensationAttempt]]:
    comp = Compensation(pk=pk, step=of, node=of.node, idempotency_key=f"k-{pk}", status=status,
                        created_at=at(created), updated_at=at(attempts[-1][1] if attempts
                                                              else created), **extra)
    tried = [CompensationAttempt(number=n, started_at=at(s), finished_at=at(e), ok=ok,
                                 result="True" if ok else "",
                                 error=None if ok else {"type": "APIConnectionError",
                                                        "message": "Stripe unreachable\nmore"})
             for n, (s, e, ok) in enumerate(attempts, 1)]
    return comp, tried


def build(the_run: Run, steps: list[Step], approvals: list[Approval] | None = None,
          undos: list[tuple[Compensation, list[CompensationAttempt]]] | None = None,
          now: float = 100) -> timeline.Timeline:
    undos = undos or []
    return timeline.build(run=the_run, steps=steps, approvals=approvals or [],
                          compensations=[c for c, _ in undos],
                          attempts={c.pk: a for c, a in undos}, now=at(now))


def bars(line: timeline.Timeline, group: str | None = None) -> list[tuple[str, int, float]]:
    """(name, lane, seconds) of each bar (of ``group``), by start."""
    return [(b.name, b.lane, round(b.seconds, 3))
            for b in sorted(line.bars, key=lambda b: b.start)
            if group is None or b.group == group]


def test_it_lays_steps_one_after_the_other_on_one_lane_and_parallel_ones_apart() -> None:
    line = build(run(), [step("create_group", 0.5, 1.0), step("notify", 1.0, 3.0),
                         step("launch_instance", 1.2, 2.2), step("attach_address", 3.0, 3.25)])

    assert bars(line) == [("create_group", 0, 0.5), ("notify", 0, 2.0),
                          ("launch_instance", 1, 1.0), ("attach_address", 0, 0.25)]
    assert line.lanes == {"steps": 2} and line.parallel == 2
    assert line.queued == 0.5  # submitted at 0, its first step at 0.5
    assert line.totals == {"steps": 2.75}  # 0.5 to 3.25, the overlap counted once
    assert (line.start, line.end, line.ticking) == (at(0), at(3.25), False)


def test_an_ai_run_has_the_models_turns_on_a_lane_of_their_own() -> None:
    asked = {"messages": [{"type": "ai", "content": "", "tool_calls": [
        {"name": "charge_card", "args": {}, "id": "c1"},
        {"name": "reserve_hotel", "args": {}, "id": "c2"}]}]}
    said = {"messages": [{"type": "ai", "content": "Your trip to Lisbon is booked."}]}
    line = build(run(), [
        step("agent", 0.1, 0.9, update=asked),
        step("tools", 1.0, 4.0, update={"messages": []}),
        step("charge_card", 1.1, 3.0, tags=["payment", TOOL_TAG]),
        step("reserve_hotel", 1.2, 3.9, tags=[TOOL_TAG]),  # at once: the model asked for both
        step("agent", 4.1, 4.6, update=said)])

    assert bars(line, "model") == [("agent", 0, 0.8), ("agent", 0, 0.5)]
    assert bars(line, "steps") == [("tools", 0, 3.0)]
    assert bars(line, "tools") == [("charge_card", 0, 1.9), ("reserve_hotel", 1, 2.7)]
    assert list(line.lanes) == ["model", "steps", "tools"]  # the page's order, top down
    model = sorted((b for b in line.bars if b.group == "model"), key=lambda b: b.start)
    assert [b.kind for b in model] == ["model", "model"]
    assert [b.detail for b in model] == ["asks for charge_card, reserve_hotel",
                                         "Your trip to Lisbon is booked."]
    assert {b.kind for b in line.bars if b.group == "tools"} == {"tool_call"}


def test_a_compensation_spans_its_attempts_and_the_waits_between_them() -> None:
    charged = step("charge_user", 1, 2)
    failed = step("book_order", 2, 2.5, Step.Status.FAILED,
                  error={"type": "BookingFailed", "message": "no seats\nTraceback"})
    line = build(run(Run.Status.COMPENSATED), [charged, failed], undos=[
        undo(charged, 2.6, Compensation.Status.SUCCEEDED,
             [(2.6, 3.1, False), (4.1, 4.6, False), (6.6, 6.9, True)])])

    (comp,) = [b for b in line.bars if b.kind == "compensation"]
    assert (comp.name, comp.status, comp.open, comp.step_id) == (
        "charge_user", "succeeded", False, charged.step_id)
    assert (comp.start, comp.end) == (at(2.6), at(6.9))
    assert [(a.number, a.ok, round((a.end - a.start).total_seconds(), 3)) for a in
            comp.attempts] == [(1, False, 0.5), (2, False, 0.5), (3, True, 0.3)]
    assert comp.attempts[0].summary == "APIConnectionError: Stripe unreachable"
    assert comp.detail == "3 attempts"
    (book,) = [b for b in line.bars if b.name == "book_order"]
    assert book.detail == "BookingFailed: no seats"
    assert line.totals["compensations"] == 4.3 and line.end == at(6.9)


def test_a_waiting_compensation_and_a_pending_approval_are_open_until_now() -> None:
    charged = step("charge_user", 1, 2)
    comp, tried = undo(charged, 3, Compensation.Status.WAITING, [(3, 3.5, False)],
                       retry_at=at(200))
    waiting = build(run(Run.Status.COMPENSATING), [charged], undos=[(comp, tried)], now=50)
    (bar,) = [b for b in waiting.bars if b.kind == "compensation"]
    assert (bar.open, bar.end, waiting.end, waiting.ticking) == (True, at(50), at(50), True)
    assert bar.detail == "1 attempt; next at 2025-05-01T12:03:20+00:00"

    gate = Approval(pk=7, step_id="t-gate", node="charge_user", status="pending",
                    requested_at=at(2))
    paused = build(run(Run.Status.PAUSED), [step("create_customer", 1, 2)], [gate], now=3602)
    (wait,) = [b for b in paused.bars if b.group == "approvals"]
    assert (wait.kind, wait.open, wait.seconds, wait.detail) == (
        "approval", True, 3600.0, "waits for an operator")
    assert timeline_svg.summary(paused) == (
        "1 h 0 min until now: queued 1.0 s, steps 1.0 s, waiting for approval 1 h 0 min")


def test_a_decided_approval_says_who_and_ends_when_decided() -> None:
    gate = Approval(pk=7, step_id="t-gate", node="charge_user", status="approved",
                    decided_by="carol", reason="known customer", requested_at=at(2),
                    decided_at=at(32))
    line = build(run(), [step("create_customer", 1, 2), step("charge_user", 32.5, 33)], [gate])
    (wait,) = [b for b in line.bars if b.group == "approvals"]
    assert (wait.open, wait.seconds, wait.detail) == (False, 30.0,
                                                      "approved by carol: known customer")
    assert line.queued == 1.0  # the first step, not the approval


def test_a_step_in_doubt_ends_where_recovery_took_over() -> None:
    started = step("launch_instance", 2, None, Step.Status.STARTED)
    earlier = step("create_group", 1, 2)
    line = build(run(Run.Status.COMPENSATED), [earlier, started], undos=[
        undo(started, 9, Compensation.Status.NOTHING_TO_UNDO, [(9, 9.5, True)], pk=2),
        undo(earlier, 9.6, Compensation.Status.SUCCEEDED, [(9.6, 10, True)], pk=3)])
    (doubt,) = [b for b in line.bars if b.name == "launch_instance" and b.kind == "step"]
    assert (doubt.status, doubt.open, doubt.end) == ("in_doubt", True, at(9))
    assert "never finished" in timeline_svg.describe(doubt)

    # The same step while its worker runs it: running, and open until now.
    live = build(run(Run.Status.RUNNING, lease_expires_at=at(200)), [earlier, started], now=5)
    (running,) = [b for b in live.bars if b.name == "launch_instance"]
    assert (running.status, running.open, running.end) == ("started", True, at(5))


def test_a_run_that_waits_for_a_worker_is_all_queue() -> None:
    line = build(run(Run.Status.PENDING), [], now=12)
    assert (line.bars, line.queued, line.ticking) == ([], 12.0, True)


def test_the_picture_labels_every_bar_and_escapes_what_came_from_outside() -> None:
    charged = step("charge_user", 1, 2, pk=11)
    line = build(run(Run.Status.COMPENSATED), [
        charged, step("<script>x</script>", 1.5, 1.6, pk=12),
        step("book_order", 2, 58, Step.Status.FAILED, pk=13,
             error={"type": "BookingFailed", "message": "no room for invoice\u202efdp.exe"})],
        undos=[
        undo(charged, 58.1, Compensation.Status.SUCCEEDED, [(58.1, 58.5, False),
                                                           (59, 59.4, True)], pk=5)])
    svg = str(timeline_svg.render(line, title="Timeline"))

    assert "<script>" not in svg and "&lt;script&gt;x&lt;/script&gt;" in svg
    assert "\u202e" not in svg
    titles = re.findall(r'<a class="tl-bar[^"]*" href="([^"]+)"[^>]*aria-label="([^"]+)">'
                        r"<title>([^<]+)</title>", svg)
    assert [(href, label) for href, label, _ in titles] == [
        ("#step-11", "Step charge_user: succeeded, took 1.0 s"),
        ("#step-12", "Step &lt;script&gt;x&lt;/script&gt;: succeeded, took 100 ms"),
        ("#step-13", "Step book_order: failed, took 56.0 s. BookingFailed: no room for "
                     "invoice[U+202E]fdp.exe"),  # a bidi control shown, never obeyed
        ("#comp-5", "Undo of charge_user: compensated, took 1.3 s. 2 attempts")]
    assert all(label == title for _, label, title in titles)
    assert 'data-lane="1"' in svg  # the short step ran beside charge_user
    assert svg.count('class="tl-attempt st-bad"') == 1 and svg.count("tl-attempt st-ok") == 1
    # The long step has its name and duration written in it; the short one beside it.
    assert ">book_order · 56.0 s</text>" in svg
    assert 'class="tl-label tl-outside"' in svg
    assert re.findall(r'class="tl-tick"[^>]*>([^<]+)<', svg) == [
        "0", "10 s", "20 s", "30 s", "40 s", "50 s"]
    assert 'class="tl-now"' not in svg  # the run is over: no "now" line
    assert 'style=' not in svg  # the CSP forbids inline styles


def test_ticks_are_round_times_in_words() -> None:
    assert timeline_svg.ticks(0.6) == [(0, "0"), (0.1, "100 ms"), (0.2, "200 ms"),
                                       (0.3, "300 ms"), (0.4, "400 ms"), (0.5, "500 ms"),
                                       (0.6, "600 ms")]
    assert [w for _, w in timeline_svg.ticks(2.5)] == ["0", "0.5 s", "1 s", "1.5 s", "2 s",
                                                       "2.5 s"]
    assert [w for _, w in timeline_svg.ticks(400)] == [
        "0", "1 min", "2 min", "3 min", "4 min", "5 min", "6 min"]
    assert [w for _, w in timeline_svg.ticks(5 * 3600)] == [
        "0", "1 h", "2 h", "3 h", "4 h", "5 h"]


def test_its_data_is_what_the_api_answers() -> None:
    charged = step("charge_user", 1, 2)
    the_run = run(Run.Status.COMPENSATED, code="9b2f2a8e-5a3b-4a55-b6a3-0f0b3b8a1c2d")
    data = timeline.as_data(build(the_run, [charged], undos=[
        undo(charged, 3, Compensation.Status.SUCCEEDED, [(3, 3.25, True)])]), the_run)
    assert (data["duration_ms"], data["queued_ms"], data["lanes"]) == (
        3250.0, 1000.0, {"steps": 1, "compensations": 1})
    assert [(b["kind"], b["name"], b["duration_ms"], b["finished_at"]) for b in
            data["bars"]] == [("step", "charge_user", 1000.0, at(2).isoformat()),
                              ("compensation", "charge_user", 250.0, at(3.25).isoformat())]
    assert data["bars"][1]["attempts"] == [
        {"number": 1, "ok": True, "started_at": at(3).isoformat(),
         "finished_at": at(3.25).isoformat(), "duration_ms": 250.0, "summary": "True"}]
