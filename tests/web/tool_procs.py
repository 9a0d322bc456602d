"""A guarded ReAct agent (``create_react_agent`` with a scripted model: charge the card, then book)
run on the web app's journal and saver exactly as a worker builds them (``runtime.journal()``: a
``DjangoJournal`` that defers its step rows on PostgreSQL; ``runtime.saver()``: the
``JournalingPostgresSaver`` that carries them), driven from the command line so that tests can
kill it inside or right after a tool call and recover it in another process as the sweeper does
(``tasks.run_recover``).

    python -m tests.web.tool_procs DIR RUN_CODE SHAPE ACTION [--hang-before-charge]
        [--hang-after-charge] [--die-as-charged] [--hang-in-book] [--fail-booking]
        [--in-doubt-safe] [--resume]

SHAPE is ``v1`` (every call of a model message in the ``tools`` task) or ``v2`` (each call a
``Send`` task of its own). ACTION is one of: invoke (the pending run, as ``run_execute`` does),
recover (as ``run_recover`` does, once the lease expired). ``--hang-before-charge`` /
``--hang-after-charge`` make the charge tool log ``started:charge`` and wait to be killed before
/ after it charged; ``--hang-in-book`` does the same in the booking tool. ``--die-as-charged``
ends the process (``os._exit(9)``) as soon as the charge call is journaled succeeded (its
``step.succeeded`` event), before LangGraph writes the call's answer. ``--in-doubt-safe`` makes
the refund look for the charge before it refunds (as a real one asks Stripe by the idempotency
key), so it may run for a call in doubt. The database is ``DATABASE_URL`` (the test's); effects
go to DIR/effects.log, one line each; the refund writes the state it is given to
DIR/refund_state.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import django
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.prebuilt import create_react_agent
from langgraph.warnings import LangGraphDeprecatedSinceV10

from tests.core.agent_support import ask, go, say

ARGS = argparse.Namespace()
CHARGE, BOOK = "charge_card", "book_room"


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


@tool
def charge_card(amount: int) -> dict[str, Any]:
    """Charge the card."""
    if ARGS.hang_before_charge:
        hang("charge")
    log(f"charge:{amount}")
    if ARGS.hang_after_charge:
        hang("charge")
    return {"id": f"ch_{amount}"}


@tool
def book_room(charge_id: str) -> str:
    """Book the room the charge pays for."""
    if ARGS.hang_in_book:
        hang("book")
    if ARGS.fail_booking:
        raise RuntimeError("no room")
    log("book")
    return "booked"


class Plan(BaseChatModel):
    """Charge, then book, then say so. Stateless (what it answers depends on the messages
    alone), so a run resumed in another process goes on where it was."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Plan:
        return self

    @property
    def _llm_type(self) -> str:
        return "scripted-plan"

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        answered = {m.name for m in messages if isinstance(m, ToolMessage)}
        message: AIMessage = (ask((CHARGE, {"amount": 500})) if CHARGE not in answered else
                              ask((BOOK, {"charge_id": "ch_500"})) if BOOK not in answered else
                              say("booked"))
        return ChatResult(generations=[ChatGeneration(message=message)])


def refund(state: Any, ctx: Any) -> bool:
    (ARGS.dir / "refund_state.json").write_text(json.dumps(state, default=repr))
    if not ctx.in_doubt:
        log(f"refund:{ctx.tool_call.result['id']}")
        return True
    # A call in doubt journaled no result: ask "the provider" (the log of this one run)
    # whether it charged, as a real refund asks Stripe by the call's key.
    charged = [line.split(":")[1] for line in logged() if line.startswith("charge:")]
    if not charged:
        return False  # it never charged: nothing to undo
    log(f"refund:ch_{charged[0]}")
    return True


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir", type=Path)
    parser.add_argument("code")
    parser.add_argument("shape", choices=["v1", "v2"])
    parser.add_argument("action", choices=["invoke", "recover"])
    parser.add_argument("--hang-before-charge", action="store_true")
    parser.add_argument("--hang-after-charge", action="store_true")
    parser.add_argument("--die-as-charged", action="store_true")
    parser.add_argument("--hang-in-book", action="store_true")
    parser.add_argument("--fail-booking", action="store_true")
    parser.add_argument("--in-doubt-safe", action="store_true")
    parser.add_argument("--resume", action="store_true")
    parser.parse_args(argv, namespace=ARGS)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stateguard_web.settings")
    django.setup()
    from django.conf import settings

    from stateguard import Compensation, Event, SagaAborted, StateGuardCheckpointer, UnwindReport
    from stateguard_web.runs import runtime
    from stateguard_web.runs.tasks import _requeue_if_never_started
    from stateguard_web.sagas.events import publish
    from stateguard_web.sagas.models import Run

    def on_event(event: Event) -> None:
        publish(event)
        if ARGS.die_as_charged and event.type == "step.succeeded" and event.node == CHARGE:
            os._exit(9)  # the call is journaled succeeded; LangGraph has not its answer yet

    # As runtime._guard builds an agent's guard, with this agent's compensation.
    guard = StateGuardCheckpointer(
        runtime.saver(), journal=runtime.journal(), on_event=on_event,
        lease_ttl=settings.STATEGUARD_LEASE_SECONDS,
        lease_heartbeat=settings.STATEGUARD_LEASE_RENEW_SECONDS,
        compensations={CHARGE: Compensation(refund, in_doubt_safe=ARGS.in_doubt_safe)})
    model = Plan()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LangGraphDeprecatedSinceV10)
        agent = guard.compile(create_react_agent(model, [charge_card, book_room],
                                                 version=ARGS.shape))
    run = Run.objects.get(code=ARGS.code)
    config: Any = runtime.config_for(run.thread_id)
    outcome: dict[str, Any] = {}
    try:
        if ARGS.action == "invoke":
            guard.invoke(agent, go(), config)
        elif _requeue_if_never_started(run.pk):  # recover, as run_recover does
            outcome["requeued"] = True
        else:
            recovered = guard.recover(agent, config, resume=ARGS.resume)
            if isinstance(recovered, UnwindReport):
                outcome["needs_attention"] = recovered.needs_attention
                outcome["report"] = str(recovered)
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
