"""The dashboard's words for every status: the one table that the badges
(``{% badge %}``), the agent's graph and its legend read, so that a status is called the same
everywhere (a compensation that succeeded is "compensated" on its badge and in the graph).

Each status has a colour class (``st-<css>`` in dashboard.css), a symbol (decoration, hidden
from screen readers: the words say the status, so colour is never the only sign of it), the
words, and for a status whose words alone may puzzle, what it means (the badge's tooltip).

A few entries are not statuses of the journal but what a page makes of one: a step ``in_doubt``
(``IN_DOUBT``), and the graph's ``awaiting_approval`` and ``not_run``.
"""

from __future__ import annotations

from dataclasses import dataclass

from stateguard_web.sagas import ledger


@dataclass(frozen=True, slots=True)
class Label:
    css: str
    symbol: str
    words: str
    meaning: str = ""  # the tooltip; "" when the words say it all


# A step the journal has "started" that no worker runs any more (dashboard.pages.step_state).
IN_DOUBT = "in_doubt"
IN_DOUBT_MEANING = ("Started and never finished: the worker running it died, or the run was "
                    "stopped, in the middle of it. Whether it had its effect is unknown.")

LABELS: dict[str, dict[str, Label]] = {
    "run": {
        "pending": Label("idle", "◌", "pending", "Submitted; waits for a worker to start it."),
        "running": Label("run", "●", "running"),
        "paused": Label("wait", "‖", "paused"),
        "failed": Label("bad", "✕", "failed"),
        "succeeded": Label("ok", "✓", "succeeded"),
        "compensating": Label("run", "↺", "compensating"),
        "compensated": Label("undo", "↩", "compensated"),
        "needs_attention": Label("bad", "⚠", "needs attention"),
    },
    "step": {
        "started": Label("run", "●", "running"),
        # interrupt() in its body: it runs again on resume
        "paused": Label("wait", "‖", "paused"),
        "succeeded": Label("ok", "✓", "succeeded"),
        "failed": Label("bad", "✕", "failed"),
        "violated": Label("bad", "⚠", "invariant violated"),
        "rewound": Label("idle", "↶", "rewound",
                         "Undone by a retry from an earlier step; it ran again after it."),
        IN_DOUBT: Label("warn", "?", "in doubt", IN_DOUBT_MEANING),
    },
    "compensation": {
        "running": Label("run", "↺", "compensating"),
        "succeeded": Label("undo", "↩", "compensated", "The compensation undid the step."),
        "nothing_to_undo": Label("idle", "○", "nothing to undo",
                                 "The compensation ran and found nothing of the step's to "
                                 "undo."),
        "failed": Label("bad", "✕", "compensation failed"),
        "skipped_in_doubt": Label("warn", "?", "skipped (in doubt)",
                                  "Not run: the step was in doubt, and its compensation is "
                                  "not declared safe to run when the step's effect is "
                                  "unknown. A person checks."),
        "waiting": Label("wait", "◷", "waiting to retry",
                         "Its attempts failed for now (a provider out of reach, say). It is "
                         "tried again on its own at the time shown, for as long as its retry "
                         "budget lasts; only then does the run need a person."),
    },
    "approval": {
        "pending": Label("wait", "‖", "awaiting decision"),
        "approved": Label("ok", "✓", "approved"),
        "rejected": Label("bad", "✕", "rejected"),
    },
    "batch": {
        "running": Label("run", "●", "running"),
        "done": Label("ok", "✓", "finished", "Every run was acted on or skipped."),
        "cancelled": Label("idle", "■", "cancelled"),
    },
    "batch_item": {
        "pending": Label("idle", "◌", "not reached yet"),
        # "done" means the action was asked of the run, not that it is carried out: the
        # run's own status says that.
        "done": Label("ok", "✓", "requested",
                      "The action was requested for this run and audited; a worker carries "
                      "it out, and the run's status shows what became of it."),
        "skipped": Label("warn", "↷", "skipped"),
        "failed": Label("bad", "✕", "failed"),
    },
    # The same words for every provider's effects (sagas.ledger says which applies).
    "effect": {
        "applied": Label("ok", "●", "applied",
                         "Done: the provider has it (a charge made, a server running, a file "
                         "deleted, an e-mail sent)."),
        "partially_compensated": Label("warn", "◐", "partly compensated",
                                       "Undone in part: refunds below the amount charged."),
        "compensated": Label("undo", "↩", "compensated",
                             "Undone: refunded, removed or restored; an e-mail, which cannot "
                             "be unsent, answered by its apology."),
        # a refund, a removal, an apology: the ledger settles what it undoes "compensated"
        "undoes": Label("undo", "↩", "undoes", "The effect that undid the one it names."),
        ledger.IN_DOUBT: Label("warn", "?", "in doubt",
                               "The ledger cannot vouch for it: the undo of its step was tried "
                               "and recorded no undo of it (it failed, waits, runs, or found "
                               "nothing). Whether the provider still has it is unknown until "
                               "someone asks: manage.py reconcile_effects."),
    },
    "graph": {
        "awaiting_approval": Label("wait", "‖", "awaiting approval"),
        "not_run": Label("idle", "", "not run"),
    },
}

# The graph's legend: one swatch per colour it draws, in the words of the statuses above.
LEGEND = (LABELS["step"]["succeeded"], LABELS["step"]["started"],
          LABELS["graph"]["awaiting_approval"], LABELS["step"]["failed"],
          LABELS["step"][IN_DOUBT], LABELS["compensation"]["succeeded"],
          LABELS["graph"]["not_run"])


def seconds_words(seconds: float) -> str:
    """How long something took, in words: "340 ms", "2.4 s", "3 min 5 s", "2 h 4 min"."""
    seconds = max(seconds, 0.0)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def label(kind: str, status: str) -> Label:
    """The label of ``status`` of a ``kind`` of thing; an unknown one is shown as it is."""
    return LABELS.get(kind, {}).get(status) or Label("idle", "•", status)
