"""A live page's re-read (dashboard/live.py): its live regions, the navigation's counts and
the workers banner, nothing of its reader's own, and one render shared by the re-reads that
arrived before it started, never by one that arrived after."""

from __future__ import annotations

import re
import threading
import time
from typing import Any
from unittest import mock

import pytest

from stateguard_web.dashboard import live
from stateguard_web.sagas import events
from stateguard_web.sagas.models import Run
from tests.web.dashboard.world import DashboardWorld

LIVE = {"HTTP_X_LIVE_REFRESH": "1"}
PAGES = {  # path: its live regions' ids
    "/": ["runs-live"],
    "/incidents/": ["incidents-live"],
    "/agents/provision/map?window=24h": ["map-live"],
    "/workers/": ["queue-now", "workers-now", "throughput"],
}


def region(html: str, element_id: str) -> str:
    """The element with ``element_id``, from its opening tag to its closing one."""
    start = re.search(rf'<(\w+) id="{element_id}"', html)
    assert start, f"no #{element_id}"
    tag, depth, at = start.group(1), 0, start.start()
    for found in re.finditer(rf"<(/?){tag}\b", html[at:]):
        depth += -1 if found.group(1) else 1
        if depth == 0:
            return html[at:html.index(">", at + found.end()) + 1]
    raise AssertionError(f"#{element_id} is not closed")


def ages(html: str) -> str:
    """Less the ages that grow between two renders ("the last one 10 min 40 s ago")."""
    return re.sub(r"<(\w+) ([^>]*)data-ticks>[^<]*</", r"<\1 \2data-ticks></", html)


class FragmentTests(DashboardWorld):
    def setUp(self) -> None:
        patch = mock.patch.object(live, "_shared", live.SharedRenders())  # none from before
        patch.start()
        self.addCleanup(patch.stop)

    def test_each_live_page_answers_a_re_read_with_its_regions_as_the_page_has_them(self) -> None:
        client = self.client_for("charlie")
        for path, ids in PAGES.items():
            page = client.get(path).content.decode()
            response = client.get(path, **LIVE)
            fragment = response.content.decode()
            assert response.status_code == 200 and response["Cache-Control"] == "no-store"
            for element_id in [*ids, "nav-count-approvals", "nav-count-attention",
                               "workers-banner"]:
                fresh, was = region(fragment, element_id), region(page, element_id)
                if element_id == "workers-banner":
                    fresh, was = ages(fresh), ages(was)
                assert fresh == was, (path, element_id)
            # Nothing of the reader's own: it may be another reader's answer too.
            assert "charlie" not in fragment and "csrfmiddlewaretoken" not in fragment
            assert "<head>" not in fragment and 'class="topbar"' not in fragment

    def test_a_re_read_is_as_the_reader_may_see_and_do(self) -> None:
        operator = self.client_for("charlie").get("/incidents/", **LIVE).content.decode()
        viewer = self.client_for("vera").get("/incidents/", **LIVE).content.decode()
        assert "data-batch=" in operator and "data-batch=" not in viewer
        alice = self.client_for("alice").get("/", **LIVE).content.decode()
        bob = self.client_for("bob").get("/", **LIVE).content.decode()
        assert str(self.paused.code) in alice and str(self.bobs.code) not in alice
        assert str(self.bobs.code) in bob and str(self.paused.code) not in bob

    def test_a_re_read_reads_the_runs_as_they_are_now(self) -> None:
        client = self.client_for("charlie")
        before = client.get("/", **LIVE).content.decode()
        Run.objects.filter(pk=self.failed.pk).update(status=Run.Status.COMPENSATED)
        after = client.get("/", **LIVE).content.decode()
        row = rf'data-run="{self.failed.code}" data-status="(\w+)"'
        assert re.search(row, before).group(1) == "failed"  # type: ignore[union-attr]
        assert re.search(row, after).group(1) == "compensated"  # type: ignore[union-attr]

    def test_a_re_read_that_saw_events_shares_a_render_that_noted_them(self) -> None:
        client = self.client_for("charlie")
        position = events.position()
        assert position is not None
        row = rf'data-run="{self.failed.code}" data-status="(\w+)"'

        def status(**headers: str) -> str:
            html = client.get("/", **LIVE, **headers).content.decode()
            return re.search(row, html).group(1)  # type: ignore[union-attr]

        assert status(HTTP_X_LIVE_SEEN=str(position)) == "failed"
        Run.objects.filter(pk=self.failed.pk).update(status=Run.Status.COMPENSATED)
        # No event of the change has been published: a reader who has seen up to the same
        # position may be answered with the render that noted it.
        assert status(HTTP_X_LIVE_SEEN=str(position)) == "failed"
        # Its event: a reader who saw it gets a render made after it.
        events._position_client().incr(events.POSITION_KEY)  # type: ignore[union-attr]
        assert status(HTTP_X_LIVE_SEEN=str(position + 1)) == "compensated"
        Run.objects.filter(pk=self.failed.pk).update(status=Run.Status.FAILED)
        for said in ["", "x", "-1", "1e3", "9" * 30, "\u0661"]:  # not a position: as if unsaid
            assert status(HTTP_X_LIVE_SEEN=said) == "failed", said

    def test_what_a_page_refuses_a_re_read_refuses_too(self) -> None:
        assert self.client_for("alice").get("/workers/", **LIVE).status_code == 403
        assert self.client_for("nobody").get("/incidents/", **LIVE).status_code == 403
        assert self.client_for(None).get("/", **LIVE).status_code == 302

    def test_readers_share_a_render_only_with_those_who_see_and_may_do_the_same(self) -> None:
        audience = {who: live.audience(getattr(self, who))
                    for who in ("alice", "bob", "vera", "charlie")}
        assert audience["alice"] != audience["bob"]  # each sees their own runs
        assert len(set(audience.values())) == 4
        from tests.web.api.world import make_user
        assert live.audience(make_user("dora", "operator")) == audience["charlie"]
        assert live.audience(make_user("eve", "viewer")) == audience["vera"]


# -- SharedRenders, between threads ------------------------------------------------------------

class Renders:
    """A render that waits to be let go, and counts the renders."""

    def __init__(self, seq: int | None = None) -> None:
        self.count = 0
        self.go = threading.Event()
        self.started = threading.Event()
        self.fail = False
        self.seq = seq  # the events' position each render notes

    def __call__(self) -> tuple[int | None, str]:
        self.count += 1
        number = self.count
        self.started.set()
        assert self.go.wait(10)
        if self.fail:
            raise RuntimeError(f"render {number} failed")
        return self.seq, f"render {number}"


def ask(shared: live.SharedRenders, key: str, renders: Renders,
        answers: dict[str, Any], name: str, seen: int | None = None) -> threading.Thread:
    def run() -> None:
        try:
            answers[name] = shared.get(key, renders, seen=seen)
        except RuntimeError as exc:
            answers[name] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def waiting(shared: live.SharedRenders, count: int) -> None:
    """Until ``count`` threads wait on ``shared``."""
    deadline = time.monotonic() + 10
    while shared.waiting < count:
        assert time.monotonic() < deadline, "the requests did not wait"
        time.sleep(0.01)


def during_a_render(renders: Renders, seen: list[int | None],
                    first_seen: int | None = None) -> dict[str, Any]:
    """What a request ("first") and then, while its render is under way, one request per item
    of ``seen`` ("later0"...) were answered, once they waited and the render was let go."""
    shared, answers = live.SharedRenders(), {}
    first = ask(shared, "page", renders, answers, "first", seen=first_seen)
    assert renders.started.wait(10)
    later = [ask(shared, "page", renders, answers, f"later{i}", seen=said)
             for i, said in enumerate(seen)]
    waiting(shared, len(seen))
    renders.go.set()
    for thread in [first, *later]:
        thread.join(10)
    return answers


def test_requests_that_came_during_a_render_share_the_next_one() -> None:
    renders = Renders()
    answers = during_a_render(renders, [None] * 5)
    # The render under way started before they came, so it may not hold what they react to.
    assert answers == {"first": "render 1", **{f"later{i}": "render 2" for i in range(5)}}
    assert renders.count == 2


def test_a_request_after_a_render_ended_renders_again() -> None:
    shared, renders = live.SharedRenders(), Renders()
    renders.go.set()
    assert shared.get("page", renders) == "render 1"
    assert shared.get("page", renders) == "render 2"


def test_a_request_that_saw_events_takes_a_render_that_noted_them() -> None:
    shared, renders = live.SharedRenders(), Renders(seq=7)
    renders.go.set()
    assert shared.get("page", renders, seen=7) == "render 1"
    # Later, having seen no newer events: the render holds them, however old it is.
    assert shared.get("page", renders, seen=7) == "render 1"
    assert shared.get("page", renders, seen=3) == "render 1"
    assert renders.count == 1
    # A newer event, or none said (a socket that just opened): a new render.
    assert shared.get("page", renders, seen=8) == "render 2"
    renders.seq = None  # the position was not known: the render holds nothing by it
    assert shared.get("page", renders) == "render 3"
    assert shared.get("page", renders, seen=1) == "render 4"
    assert shared.get("page", renders, seen=1) == "render 5"


def test_requests_that_saw_events_wait_for_the_render_under_way_if_it_may_hold_them() -> None:
    renders = Renders(seq=5)
    answers = during_a_render(renders, [4, 5, 4, 5, 6], first_seen=5)  # later4 saw more
    # The render under way held what the later ones saw: they rendered nothing (one may have
    # woken after the newer one's render, which holds it too).
    assert answers["first"] == "render 1" and answers["later4"] == "render 2"
    assert {answers[f"later{i}"] for i in range(4)} <= {"render 1", "render 2"}
    assert renders.count == 2


def test_keys_do_not_wait_for_each_other() -> None:
    shared, renders, answers = live.SharedRenders(), Renders(), {}
    first = ask(shared, "a page", renders, answers, "a")
    assert renders.started.wait(10)
    other = Renders()
    other.go.set()
    assert shared.get("another page", other) == "render 1"  # while "a page" renders
    renders.go.set()
    first.join(10)
    assert answers == {"a": "render 1"}


def test_a_failed_render_fails_its_own_request_and_the_others_render() -> None:
    renders = Renders()
    renders.fail = True
    answers = during_a_render(renders, [None] * 3)
    assert all(isinstance(a, RuntimeError) for a in answers.values()) and len(answers) == 4
    assert str(answers["first"]) == "render 1 failed"
    # Each waiting request tried in its turn; none took another's failure for an answer.
    assert renders.count == 4


@pytest.mark.parametrize("keys", [live.KEEP + 10])
def test_it_keeps_a_bounded_number_of_keys(keys: int) -> None:
    shared, renders = live.SharedRenders(), Renders()
    renders.go.set()
    for i in range(keys):
        shared.get(f"page {i}", renders)
    assert len(shared._slots) <= live.KEEP
