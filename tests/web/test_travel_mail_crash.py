"""The travel agent's e-mail across a worker killed mid-send: real Celery workers, localstripe,
and the test's SMTP server (``mail_server``), which pins the worker inside a send: it holds
the message before it accepted it, or after (kept, the ``250`` not yet sent), until the test
has SIGKILLed the worker; a second worker, with the beat, recovers the run. The agent's code
has no test hook.

Whatever the moment of death: one confirmation and one apology in reply to it per unwound run,
never two of either; none of either when the server never accepted the confirmation.
"""

from __future__ import annotations

from collections.abc import Callable
from email.message import EmailMessage

import pytest
import stripe

from stateguard_web.runs import services
from stateguard_web.sagas.models import Compensation, Effect, Run
from tests.conftest import STRIPE_TEST_KEY
from tests.mail_server import Hold, MailServer
from tests.web.conftest import Workers, wait_for

pytestmark = pytest.mark.slow  # real processes, killed: not in make check

TRIP = {"email": "alice@example.com", "destination": "Lisbon", "nights": 2, "amount": 42_00}
DONE = {Run.Status.SUCCEEDED, Run.Status.COMPENSATED, Run.Status.NEEDS_ATTENTION}
CONFIRMATION, APOLOGY = b"Subject: Your trip", b"Subject: Cancelled"


@pytest.fixture
def pool(workers: Workers, localstripe_url: str, stripe_client: stripe.StripeClient
         ) -> Workers:
    workers.env.update(STRIPE_API_BASE=localstripe_url, STRIPE_API_KEY=STRIPE_TEST_KEY)
    return workers


def finished(run: Run, done: set[str] = DONE) -> Run | None:
    run.refresh_from_db()
    return run if run.status in done else None


def kill_mid_send(pool: Workers, mail_server: MailServer, hold: Hold,
                  act: Callable[[], Run]) -> Run:
    """``act`` (on a worker started for it), SIGKILL that worker once ``hold`` pinned it in a
    send, and let a second worker (with the beat) recover the run; the run, finished."""
    doomed = pool.start("doomed")
    run = act()
    wait_for(hold.reached.is_set, 90, "the worker to reach the held e-mail", pool.logs)
    pool.start("rescuer", beat=True)  # boots meanwhile; the doomed one renews its lease
    pool.kill(doomed)
    mail_server.release()  # the server answers a dead client
    wait_for(lambda: finished(run), 90, "recovery to finish the run", pool.logs)
    return run


def mail_ledger(run: Run) -> list[tuple[str, str, str]]:
    return [(e.external_id, e.status, e.undoes)
            for e in Effect.objects.filter(run=run, provider="smtp").order_by("pk")]


def refunded_once(client: stripe.StripeClient) -> bool:
    return [(c.amount, c.amount_refunded) for c in client.v1.charges.list().data] == [
        (42_00, 42_00)] and len(client.v1.refunds.list().data) == 1


def one_apology(run: Run, sent: list[EmailMessage]) -> None:
    """One confirmation and one apology in reply to it; the ledger records both."""
    confirmation, apology = sent
    assert (confirmation["Subject"], apology["Subject"]) == (
        "Your trip to Lisbon", "Cancelled: your trip to Lisbon")
    assert apology["In-Reply-To"] == apology["References"] == confirmation["Message-ID"]
    assert mail_ledger(run) == [
        (confirmation["Message-ID"], "compensated", ""),
        (apology["Message-ID"], "compensated", confirmation["Message-ID"])]
    assert run.compensations.get(node="send_confirmation").status == (
        Compensation.Status.SUCCEEDED)


@pytest.mark.parametrize("accepted", [True, False], ids=["accepted", "not-accepted"])
def test_a_worker_killed_sending_the_confirmation_leaves_one_apology_or_none(
        accepted: bool, pool: Workers, mail_server: MailServer,
        stripe_client: stripe.StripeClient) -> None:
    hold = mail_server.hold(CONFIRMATION, accepted=accepted)
    run = kill_mid_send(pool, mail_server, hold, lambda: services.run_submit(
        agent="travel", input=TRIP, by="alice"))

    assert run.status == Run.Status.COMPENSATED, run.error
    assert refunded_once(stripe_client)
    sent = mail_server.messages(run=str(run.code))
    if accepted:  # the server has it: the apology found it there
        one_apology(run, sent)
    else:  # never accepted: nothing to take back, nothing sent
        assert sent == [] and mail_ledger(run) == []
        assert run.compensations.get(node="send_confirmation").status == (
            Compensation.Status.NOTHING_TO_UNDO)


def test_a_worker_killed_sending_the_apology_sends_it_once(
        pool: Workers, mail_server: MailServer, stripe_client: stripe.StripeClient) -> None:
    hold = mail_server.hold(APOLOGY, accepted=True)  # kept: the rescuer must not send again

    def book_then_cancel() -> Run:
        run = services.run_submit(agent="travel", input=TRIP, by="alice")
        wait_for(lambda: finished(run), 60, "the trip to be booked", pool.logs)
        assert run.status == Run.Status.SUCCEEDED, run.error
        return services.run_compensate(run=run, by="olivia")

    run = kill_mid_send(pool, mail_server, hold, book_then_cancel)

    assert run.status == Run.Status.COMPENSATED, run.error
    assert refunded_once(stripe_client)
    one_apology(run, mail_server.messages(run=str(run.code)))


def test_a_trip_resumed_after_a_worker_died_mid_send_confirms_it_once(
        pool: Workers, mail_server: MailServer, stripe_client: stripe.StripeClient) -> None:
    # The deployment resumes travel runs whose worker died: the call cut off runs again, and
    # finds its confirmation at the server instead of sending it twice.
    pool.env["STATEGUARD_ON_CRASH"] = "travel=resume"
    hold = mail_server.hold(CONFIRMATION, accepted=True)
    run = kill_mid_send(pool, mail_server, hold, lambda: services.run_submit(
        agent="travel", input=TRIP, by="alice"))

    assert run.status == Run.Status.SUCCEEDED, run.error
    [confirmation] = mail_server.messages(run=str(run.code))
    assert mail_ledger(run) == [(confirmation["Message-ID"], "applied", "")]
    assert [(c.amount, c.amount_refunded) for c in stripe_client.v1.charges.list().data] == [
        (42_00, 0)]
