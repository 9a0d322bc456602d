"""The dashboard's forms: what each action takes (the runs list's filters are
``runs.filters``, shared with the API)."""

from __future__ import annotations

from django import forms

MAX_ID = 2**63 - 1


class _Reason(forms.Form):
    reason = forms.CharField(required=False, max_length=2000, strip=True,
                             widget=forms.Textarea(attrs={"rows": 2}))


class DecisionForm(_Reason):
    """Approve or reject: the approval the operator was shown (deciding any other is refused)."""

    approval = forms.IntegerField(min_value=1, max_value=MAX_ID, widget=forms.HiddenInput)


class CompensateForm(_Reason):
    pass


class TerminateForm(_Reason):
    """Terminate: what happens once the run stopped (the service checks it against the run)."""

    then = forms.ChoiceField(choices=[("unwind", "Unwind it"), ("hold", "Hold it")],
                             widget=forms.RadioSelect)


class RetryFromForm(forms.Form):
    """Retry from an earlier step: the step the operator was shown, and an optional update of
    the agent's state (a JSON object), set before the step runs again."""

    step = forms.CharField(max_length=300, widget=forms.HiddenInput)
    update = forms.JSONField(
        required=False, label="Update of the state (JSON, optional)",
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": '{"key": "value"}'}),
        help_text="Values set in the agent's state before the step runs again.")

    def clean_update(self) -> dict[str, object] | None:
        update = self.cleaned_data.get("update")
        if update in (None, ""):
            return None
        if not isinstance(update, dict):
            raise forms.ValidationError("Give a JSON object of the state's keys.")
        return update


class ResolveForm(forms.Form):
    note = forms.CharField(max_length=2000, strip=True, label="What was done by hand",
                           widget=forms.Textarea(attrs={"rows": 3}))
