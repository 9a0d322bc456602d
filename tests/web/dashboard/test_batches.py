"""Batches on the dashboard: the list's ticks and "every run matching this filter", the
confirmation (how many runs of which statuses), the batch's page with its live progress and
cancel button, per role, and its websocket."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.test import Client

from stateguard_web.asgi import application
from stateguard_web.batches import services as batches
from stateguard_web.batches import worker as batch_worker
from stateguard_web.sagas import events
from stateguard_web.sagas.models import AuditEvent, Batch, Run
from tests.web.api.world import make_user
from tests.web.dashboard.world import DashboardWorld, journal_state


def button(html: str) -> str | None:
    """The confirmation's submit button's words, if it has one."""
    found = re.search(r'<button type="submit" class="button [a-z]+">([^<]+)</button>', html)
    return found[1] if found else None


def reason_label(html: str) -> str:
    return re.search(r'<label for="batch-reason">Reason <span class="muted">([^<]+)</span>',
                     html)[1]  # type: ignore[index]


def confirmed_runs(html: str) -> list[str]:
    return re.search(r'name="runs" value="([^"]*)"', html)[1].split(",")  # type: ignore[index]


class BatchPageTests(DashboardWorld):
    def test_it_offers_ticks_and_the_batch_form_to_operators_only(self) -> None:
        page = self.client_for("charlie").get("/").content.decode()
        assert 'id="batch-form"' in page
        assert page.count('data-pick aria-label') == Run.objects.count()
        for who in ("vera", "alice"):
            page = self.client_for(who).get("/").content.decode()
            assert 'id="batch-form"' not in page and "data-pick" not in page

    def test_it_confirms_the_runs_ticked_with_their_statuses(self) -> None:
        client = self.client_for("charlie")
        response = client.get("/batches/new", {"action": "compensate", "scope": "selected",
                                               "runs": [self.failed.code, self.scripted.code,
                                                        self.stuck.code]})
        assert response.status_code == 200
        page = response.content.decode()
        assert "Compensate 3 runs?" in page
        counts = dict(re.findall(r'data-status-count="(\w+)">(\d+)<', page))
        assert counts == {"failed": "1", "succeeded": "1", "needs_attention": "1"}
        assert 'data-eligible="3"' in page
        assert confirmed_runs(page) == [str(r.code) for r in (self.failed, self.scripted,
                                                              self.stuck)]
        assert not Batch.objects.exists()

    def test_it_confirms_every_run_matching_the_filter(self) -> None:
        response = self.client_for("charlie").get("/batches/new", {
            "action": "retry", "scope": "filter", "agent": "provision"})
        page = response.content.decode()
        assert "Retry 1 of 3 runs?" in page  # failed, stuck and bob's: provision runs
        assert 'data-eligible="1"' in page
        assert "the other <strong>2</strong> will be skipped" in page
        # The button says what it does: the one run that fits is retried.
        assert button(page) == "Retry 1 run"
        assert set(confirmed_runs(page)) == {str(r.code) for r in (self.failed, self.stuck,
                                                                   self.bobs)}

    def test_it_says_where_the_reason_goes_for_each_action(self) -> None:
        client = self.client_for("charlie")
        retry = client.get("/batches/new", {"action": "retry", "runs": [self.failed.code]})
        label = reason_label(retry.content.decode())
        assert label == "(optional: kept with the batch and shown on its page)"
        for action in ("compensate", "retry_compensations"):
            page = client.get("/batches/new", {"action": action, "runs": [self.stuck.code]})
            assert "compensation request" in reason_label(page.content.decode()), action

    def test_it_offers_no_button_when_no_run_fits_the_action(self) -> None:
        page = self.client_for("charlie").get("/batches/new", {
            "action": "retry", "runs": [self.stuck.code, self.bobs.code]}).content.decode()
        assert "Retry 0 of 2 runs?" in page and 'data-eligible="0"' in page
        assert button(page) is None and 'action="/batches/"' not in page
        assert "None of these runs fits the action now" in page

    def test_it_sends_an_empty_or_bad_selection_back_to_the_list_with_why(self) -> None:
        client = self.client_for("charlie")
        response = client.get("/batches/new", {"action": "retry", "scope": "selected",
                                               "agent": "provision"}, follow=True)
        assert response.redirect_chain[-1][0] == "/?agent=provision"
        assert "No batch: the selection is empty." in response.content.decode()
        response = client.get("/batches/new", {"action": "explode"}, follow=True)
        assert "Choose what to do with the runs." in response.content.decode()

    def test_it_makes_the_batch_confirmed_and_shows_its_page(self) -> None:
        client = self.client_for("charlie", csrf=True)
        page = client.get("/batches/new", {"action": "compensate", "runs": [
            self.failed.code, self.stuck.code]}).content.decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)[1]  # type: ignore[index]
        with self.captureOnCommitCallbacks():
            response = client.post("/batches/", {
                "csrfmiddlewaretoken": token, "action": "compensate", "reason": "outage",
                "runs": ",".join(confirmed_runs(page))})
        batch = Batch.objects.get()
        assert response.status_code == 302 and response["Location"] == f"/batches/{batch.code}/"
        assert list(batch.items.values_list("run_id", flat=True)) == [self.failed.pk,
                                                                       self.stuck.pk]
        assert (batch.actor, batch.reason) == ("charlie", "outage")

        page = client.get(response["Location"]).content.decode()
        assert 'data-live="batch"' in page and 'data-dialog="confirm-cancel"' in page
        assert page.count('data-outcome="pending"') == 2
        batch_worker.batch_process(batch_pk=batch.pk, owner="w1")
        page = client.get(response["Location"]).content.decode()
        assert page.count('data-outcome="done"') == 2 and 'value="100"' in page
        assert 'data-dialog="confirm-cancel"' not in page  # finished: nothing to cancel
        # "done" is "requested": the page says what became of the request, run by run.
        assert 'data-status="done" title="Every run was acted on or skipped."' in page
        assert page.count('<span aria-hidden="true">✓</span> requested</span>') == 3
        assert re.findall(r"<td data-what>([^<]*)</td>", page) == [
            "Requested (compensate by charlie): it waits for a worker to take it up."] * 2
        Run.objects.filter(pk=self.failed.pk).update(status=Run.Status.COMPENSATED)
        page = client.get(response["Location"]).content.decode()
        assert re.findall(r"<td data-what>([^<]*)</td>", page)[0] == (
            "Requested, and a worker took it up: the run is compensated now.")

    def test_it_refuses_a_batch_without_the_csrf_token_or_from_a_viewer(self) -> None:
        state = journal_state()
        data = {"action": "retry", "runs": str(self.failed.code)}
        assert self.client_for("charlie", csrf=True).post("/batches/", data).status_code == 403
        assert self.client_for("vera").post("/batches/", data).status_code == 403
        assert self.client_for("vera").get("/batches/new", data).status_code == 403
        assert journal_state() == state and not Batch.objects.exists()

    def test_it_cancels_from_the_page_and_shows_it_to_viewers_without_the_button(self) -> None:
        batch = batches.batch_create(action="retry", by=self.charlie, runs=Run.objects.all(),
                                     codes=[self.failed.code])
        path = f"/batches/{batch.code}/"
        viewer = self.client_for("vera").get(path).content.decode()
        assert "Cancel the batch" not in viewer and str(self.failed.code)[:8] in viewer
        assert self.client_for("vera").post(path + "cancel").status_code == 403
        assert self.client_for("alice").get(path).status_code == 404

        response = self.client_for("charlie").post(path + "cancel", follow=True)
        page = response.content.decode()
        assert "Batch cancelled" in page and "the batch was cancelled by charlie" in page
        assert Batch.objects.get().status == "cancelled"
        assert AuditEvent.objects.filter(action="batch.cancelled").count() == 1


@pytest.fixture
def memory_layer(settings: Any) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.mark.django_db(transaction=True)
async def test_its_socket_forwards_the_batchs_progress_to_those_who_see_every_run(
        memory_layer: None) -> None:
    from channels.db import database_sync_to_async

    @database_sync_to_async
    def setup() -> tuple[Batch, dict[str, bytes]]:
        charlie = make_user("charlie", "operator")
        cookies = {}
        for user in (charlie, make_user("vera", "viewer"), make_user("alice", "submitter")):
            client = Client()
            client.force_login(user)
            cookies[user.username] = f"sessionid={client.cookies['sessionid'].value}".encode()
        run = Run.objects.create(agent="checkout", status=Run.Status.FAILED)
        batch = batches.batch_create(action="retry", by=charlie, runs=Run.objects.all(),
                                     codes=[run.code])
        return batch, cookies

    batch, cookies = await setup()
    path = f"/ws/batches/{batch.code}/"

    def socket(cookie: bytes | None) -> WebsocketCommunicator:
        headers = [(b"origin", b"http://localhost:8000"), (b"host", b"localhost:8000")] + (
            [(b"cookie", cookie)] if cookie else [])
        return WebsocketCommunicator(application, path, headers=headers)

    for cookie in (None, cookies["alice"]):  # anonymous, a submitter
        refused = socket(cookie)
        assert (await refused.connect())[0] is False
    viewer = socket(cookies["vera"])
    assert (await viewer.connect())[0] is True
    progress = {"type": "batch.progress", "batch": str(batch.code), "data": {"counts": {}}}
    # What the publisher sends (sagas.events: test_batch_acceptance reads it from Redis).
    await get_channel_layer().group_send(events.batch_group(batch.code),
                                         {"type": "batch.events", "events": [progress]})
    message = await asyncio.wait_for(viewer.receive_json_from(), 10)
    assert message == {"type": "batch.events", "events": [progress]}
    await viewer.disconnect()
