"""A guarded ``@entrypoint`` (charge the card, then book) run on the web app's journal and saver
exactly as a worker builds them (``runtime.journal()``: a ``DjangoJournal`` that defers its step
rows on PostgreSQL; ``runtime.saver()``: the ``JournalingPostgresSaver`` that carries them),
driven from the command line so that tests can kill it between or inside its tasks and recover
it in another process as the sweeper does (``tasks.run_recover``).

    python -m tests.web.func_procs DIR RUN_CODE ACTION [--die-between] [--die-after SECONDS]
        [--hang-before-charge] [--hang-after-charge] [--hang-in-book] [--fail-booking]
        [--in-doubt-safe] [--resume]

ACTION is one of: invoke (the pending run, as ``run_execute`` does), recover (as
``run_recover`` does, once the lease expired). ``--die-between`` ends the process
(``os._exit``) as soon as the charge task returned; ``--die-after`` waits that long first.
``--hang-before-charge`` / ``--hang-after-charge`` make the charge task log ``started:charge``
and wait to be killed before / after it charged; ``--hang-in-book`` does the same in the
booking task. ``--in-doubt-safe`` makes the refund look for the charge before it refunds (as a
real one asks Stripe by the idempotency key), so it may run for a charge in doubt. The
database is ``DATABASE_URL`` (the test's); effects go to DIR/effects.log, one line each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import django
from langgraph.func import entrypoint, task

ARGS = argparse.Namespace()


def log(line: str) -> None:
    fd = os.open(ARGS.dir / "effects.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def logged() -> list[str]:
    path = ARGS.dir / "effects.log"
    return path.read_text().split() if path.exists() else []


def hang(what: str) -> None:
    log(f"started:{what}")
    time.sleep(60)  # the test kills us here


@task
def charge_card(amount: int) -> dict[str, Any]:
    if ARGS.hang_before_charge:
        hang("charge")
    log(f"charge:{amount}")
    if ARGS.hang_after_charge:
        hang("charge")
    return {"id": f"ch_{amount}"}


@task
def book(charge: dict[str, Any]) -> str:
    if ARGS.hang_in_book:
        hang("book")
    if ARGS.fail_booking:
        raise RuntimeError("no room")
    log("book")
    return "booked"


def trip(inp: dict[str, int]) -> dict[str, Any]:
    charge = charge_card(inp["amount"]).result()
    if ARGS.die_between or ARGS.die_after:
        time.sleep(ARGS.die_after)
        os._exit(9)
    return {"charge": charge, "booking": book(charge).result()}


def refund(args: dict[str, Any], ctx: Any) -> bool:
    if not ctx.in_doubt:
        log(f"refund:{ctx.step_result['id']}")
        return True
    # A charge in doubt journaled no arguments nor result: ask "the provider" (the log of this
    # one run) whether it charged, as a real refund asks Stripe by the charge's key.
    charged = [line.split(":")[1] for line in logged() if line.startswith("charge:")]
    if not charged:
        return False  # it never charged: nothing to undo
    log(f"refund:ch_{charged[0]}")
    return True


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir", type=Path)
    parser.add_argument("code")
    parser.add_argument("action")
    parser.add_argument("--die-between", action="store_true")
    parser.add_argument("--die-after", type=float, default=0.0)
    parser.add_argument("--hang-before-charge", action="store_true")
    parser.add_argument("--hang-after-charge", action="store_true")
    parser.add_argument("--hang-in-book", action="store_true")
    parser.add_argument("--fail-booking", action="store_true")
    parser.add_argument("--in-doubt-safe", action="store_true")
    parser.add_argument("--resume", action="store_true")
    parser.parse_args(argv, namespace=ARGS)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stateguard_web.settings")
    django.setup()
    from django.conf import settings

    from stateguard import Compensation, SagaAborted, StateGuardCheckpointer, UnwindReport
    from stateguard_web.runs import runtime
    from stateguard_web.runs.tasks import _requeue_if_never_started
    from stateguard_web.sagas.events import publish
    from stateguard_web.sagas.models import Run

    # As runtime._guard builds an agent's guard, with this workflow's compensation.
    guard = StateGuardCheckpointer(
        runtime.saver(), journal=runtime.journal(), on_event=publish,
        lease_ttl=settings.STATEGUARD_LEASE_SECONDS,
        lease_heartbeat=settings.STATEGUARD_LEASE_RENEW_SECONDS,
        compensations={"charge_card": Compensation(refund, in_doubt_safe=ARGS.in_doubt_safe)})
    workflow = guard.compile(entrypoint()(trip))
    run = Run.objects.get(code=ARGS.code)
    config: Any = runtime.config_for(run.thread_id)
    outcome: dict[str, Any] = {}
    try:
        if ARGS.action == "invoke":
            outcome["out"] = guard.invoke(workflow, {"amount": 500}, config)
        elif ARGS.action == "recover":
            if _requeue_if_never_started(run.pk):  # as run_recover does
                outcome["requeued"] = True
            else:
                recovered = guard.recover(workflow, config, resume=ARGS.resume)
                if isinstance(recovered, UnwindReport):
                    outcome["needs_attention"] = recovered.needs_attention
                    outcome["report"] = str(recovered)
                else:
                    outcome["out"] = recovered
        outcome["status"] = str(guard.status(config).run.status)
    except SagaAborted as exc:
        outcome["aborted"] = str(exc)
        outcome["status"] = str(guard.status(config).run.status)
    except Exception as exc:
        outcome["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        runtime.close()
    print(json.dumps(outcome), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
