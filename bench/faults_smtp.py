"""Issue 22, fault 1 (R2) for e-mail: the travel agent's SMTP server fails a share of the
messages sent to it. ``faults_stripe.py --agent travel`` under the harness's name for it:

    .venv/bin/python bench/faults.py --fault smtp [--runs 60] [--seed 1] [--failures 0.3]
        [--folder hidden|readable]

The runs charge on localstripe (no fault there), hold a room and e-mail a confirmation through
an ``SmtpFaultRelay`` (``bench/fault_relay.py``) in front of ``make run``'s SMTP server; half of
them (by the seed) go to Atlantis, which has no hotel, and unwind: refund, apology. The relay
fails ``--failures`` of the messages, half before the server kept them (``451`` or ``421`` to
MAIL, RCPT or DATA; ``timeout``: the message held, never handed over), half after (``cut``,
``late``: kept, the ``250`` lost). ``--folder readable`` lets the agents ask the server's folder
what it accepted (``make run``'s case), ``hidden`` (the default) not (a real mail server's).

Counted at the server's folder (``chaos_world.count_mail``): two confirmations of a run, two
apologies of one confirmation, one message accepted twice (copies under one ``Message-ID``:
the rule where the server cannot be asked, reported apart then), unwound runs whose accepted
confirmation has no apology, apologies of succeeded runs or of confirmations never accepted;
then Stripe, the rooms and ``reconcile_effects`` as ``r1_chaos.py --agent travel`` counts them,
and the runs not settled. Every other option is ``faults_stripe.py``'s.
"""

from __future__ import annotations

from bench import faults_stripe


def main(argv: list[str]) -> int:
    return faults_stripe.main(["--agent", "travel", *argv])
