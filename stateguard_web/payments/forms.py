"""The refund confirmation form: what the operator may send, each input checked."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core import signing

from stateguard_web.payments.selectors import ChargeState
from stateguard_web.payments.services import MAX_REASON

__all__ = ["RefundForm", "seen_token"]

_SALT = "stateguard.payments.refund"
PAGE_MAX_AGE = 3600  # seconds a confirmation page may be submitted after it was shown


def seen_token(states: list[ChargeState]) -> str:
    """What the page showed of each refundable charge (Stripe's refunded amount), signed: the
    refund is refused if it moved meanwhile (a double submit, another admin), and nothing in
    it can be changed on the way."""
    return signing.dumps({str(s.effect.pk): s.refunded for s in states if s.remaining > 0},
                         salt=_SALT)


# Text, not a number input: in Chromium (measured) a number input drops what it does not take
# as it is typed, so "12,5" is sent as 125 and "abc" as an empty amount, which means "all that
# remains". A text input sends what was typed, and the form says what is wrong with it.
AMOUNT_INPUT = forms.TextInput(attrs={"inputmode": "numeric", "autocomplete": "off"})


class RefundForm(forms.Form):
    amount = forms.IntegerField(required=False)  # replaced in __init__, or removed
    reason = forms.CharField(
        max_length=MAX_REASON, widget=forms.Textarea(attrs={"rows": 3, "cols": 70}),
        help_text="Why this is refunded: kept in the audit trail and in the refund's "
                  "metadata at Stripe.")
    resolve = forms.BooleanField(
        required=False, label="Also resolve the run",
        help_text="The run needs attention: mark it compensated by hand, with this refund, "
                  "in the same step.")
    seen = forms.CharField(widget=forms.HiddenInput, max_length=4000)

    def __init__(self, *args: Any, states: list[ChargeState], offers_resolve: bool,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.states = states
        refundable = [s for s in states if s.remaining > 0]
        if len(refundable) == 1:  # a part of one charge; of several, what remains of each
            state = refundable[0]
            limit = (f"At most {state.remaining} ({state.show(state.remaining)}) remains to be "
                     f"refunded of {state.effect.external_id}.")
            self.fields["amount"] = forms.IntegerField(
                required=False, min_value=1, max_value=state.remaining, widget=AMOUNT_INPUT,
                label=f"Amount in the smallest unit of {state.currency.upper()} (cents)",
                help_text=f"Empty: all that remains, {state.remaining} "
                          f"({state.show(state.remaining)}).",
                error_messages={"max_value": limit,
                                "min_value": "The amount must be at least 1.",
                                "invalid": "The amount must be a whole number (cents)."})
        else:
            del self.fields["amount"]
        if not offers_resolve:
            del self.fields["resolve"]

    def clean_seen(self) -> dict[int, int]:
        stale = forms.ValidationError("This page is out of date or was altered: open it again.")
        try:
            seen = signing.loads(self.cleaned_data["seen"], salt=_SALT, max_age=PAGE_MAX_AGE)
        except signing.BadSignature:  # SignatureExpired is one too
            raise stale from None
        shown = {s.effect.pk for s in self.states}
        if not isinstance(seen, dict) or not all(
                isinstance(k, str) and k.isdigit() and int(k) in shown
                and isinstance(v, int) and v >= 0 for k, v in seen.items()):
            raise stale
        return {int(k): v for k, v in seen.items()}

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if not any(s.remaining > 0 for s in self.states):
            raise forms.ValidationError("Nothing remains to be refunded.")
        return data
