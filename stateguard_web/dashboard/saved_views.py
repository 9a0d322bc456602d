"""Saved views of the runs list: a user names the list as it is now (its filters and order,
``runs.filters.kept``) and comes back to it from the list's menu. Each user's own: another's
view is not found (404), whoever asks."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from stateguard_web.accounts import access, services
from stateguard_web.accounts.access import Ability
from stateguard_web.runs.filters import RunFilterForm, kept


class SavedViewForm(forms.Form):
    name = forms.CharField(max_length=100, strip=True)
    query = forms.CharField(required=False, max_length=2000)


def _list(query: str) -> HttpResponse:
    return redirect(reverse("dashboard:runs") + (f"?{query}" if query else ""))


@login_required
@require_POST
def view_save(request: HttpRequest) -> HttpResponse:
    """Save the list's query under a name (the same name again: its query now)."""
    access.check(request.user, Ability.VIEW)
    form = SavedViewForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Name the view (at most 100 characters) to save it.")
        return _list(kept(QueryDict(request.POST.get("query", "")[:2000])))
    # Only the list's own parameters, and only valid ones: a saved view opens the list it
    # says, not an error page.
    query = QueryDict(form.cleaned_data["query"])
    problems = RunFilterForm(query).problems()
    if problems:
        messages.error(request, f"Not saved: {' '.join(problems)}")
        return _list(kept(query))
    name, kept_query = form.cleaned_data["name"], kept(query)
    try:
        services.saved_view_save(user=request.user, name=name, query=kept_query)
    except services.TooManyViews as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Saved the view “{name}”: it is in the Saved views menu.")
    return _list(kept_query)


@login_required
@require_POST
def view_delete(request: HttpRequest, pk: int) -> HttpResponse:
    access.check(request.user, Ability.VIEW)
    view = services.saved_view_delete(user=request.user, pk=pk)
    if view is None:
        raise Http404("You have no such saved view.")
    messages.success(request, f"Deleted the view “{view.name}”.")
    return redirect("dashboard:runs")
