"""The effect ledger is ``sagas.Effect`` (the journal writes it); this app adds what people do
with it: refunds by hand and reconciliation with Stripe.

``LedgerEffect`` is a proxy of ``sagas.Effect`` (no table of its own): the admin shows the ledger
under Payments, and the refund permission belongs to this app, so the journal needs no
migration for it and never imports payments.
"""

from __future__ import annotations

from stateguard_web.sagas.models import Effect

REFUND_PERMISSION = "payments.refund_effect"


class LedgerEffect(Effect):
    class Meta:
        proxy = True
        verbose_name = "effect"
        verbose_name_plural = "effect ledger"
        # Only the refund permission: reading the ledger is reading runs (accounts.access), and
        # nobody adds, changes or deletes ledger rows by hand.
        default_permissions = ()
        permissions = [("refund_effect", "Can refund charges by hand and verify the ledger "
                                         "with Stripe")]
