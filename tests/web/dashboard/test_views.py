"""The dashboard's pages and actions through Django's test client, per role."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import Any
from unittest import mock

import redis
from django.conf import settings
from django.test import Client
from django.utils import timezone

from stateguard_web.dashboard import pages
from stateguard_web.monitoring import heartbeat
from stateguard_web.sagas.models import Approval, AuditEvent, Compensation, Run, Step
from tests.web.dashboard.world import SCRIPT, DashboardWorld, journal_state

ACTION_URL = re.compile(r'action="/runs/[0-9a-f-]+/(approve|reject|retry|compensate|resolve|'
                        r'terminate|compensations/\d+/retry)"')


def outside_details(html: str) -> str:
    """What a page shows before anything is clicked open: ``html`` less every closed
    ``<details>`` (the ones the page opens itself are kept)."""
    shown, depth = [], 0
    for part in re.split(r"(<details\b[^>]*>|</details>)", html):
        if part.startswith("<details"):
            depth += 0 if depth == 0 and " open" in part else 1
        elif part == "</details>":
            depth = max(depth - 1, 0)
        elif depth == 0:
            shown.append(part)
    return "".join(shown)


def graph_svg(html: str) -> str:
    """The agent's graph on a run's page (the timeline above it is an SVG too)."""
    start = html.index('<svg class="graph"')
    return html[start:html.index("</svg>", start)]


def actions_on(html: str) -> list[str]:
    """The action forms a page offers (the POST targets of its confirmations)."""
    return sorted(set(ACTION_URL.findall(html)))


class PageTests(DashboardWorld):
    def test_it_sends_an_anonymous_visitor_to_the_login_page(self) -> None:
        for path in ["/", self.url(self.paused), "/inbox/approvals/", "/inbox/attention/"]:
            response = self.client_for(None).get(path)
            assert response.status_code == 302, path
            assert response["Location"].startswith("/login/?next=")

    def test_it_logs_in_with_the_csrf_token_and_out_with_a_post(self) -> None:
        client = self.client_for(None, csrf=True)
        page = client.get("/login/")
        assert page.status_code == 200
        token = page.cookies["csrftoken"].value
        refused = client.post("/login/", {"username": "charlie", "password": "pw-charlie"})
        assert refused.status_code == 403  # no token
        response = client.post("/login/", {"username": "charlie", "password": "pw-charlie",
                                           "csrfmiddlewaretoken": token})
        assert response.status_code == 302 and response["Location"] == "/"
        home = client.get("/")
        assert home.status_code == 200
        assert 'class="username">charlie<' in home.content.decode()
        assert 'class="role">operator<' in home.content.decode()
        token = client.cookies["csrftoken"].value
        assert client.post("/logout/").status_code == 403  # no token: still logged in
        assert client.get("/").status_code == 200
        assert client.post("/logout/", {"csrfmiddlewaretoken": token}).status_code == 302
        assert client.get("/").status_code == 302

    def test_it_refuses_a_wrong_password(self) -> None:
        response = self.client_for(None).post("/login/", {"username": "charlie",
                                                          "password": "nope"})
        assert response.status_code == 200
        assert "enter a correct username and password" in response.content.decode()

    def test_it_shows_each_role_and_the_inbox_counts_in_the_navigation(self) -> None:
        for who, role, approvals, attention in [("charlie", "operator", 1, 2),
                                                ("vera", "viewer", 1, 2),
                                                ("alice", "submitter", 1, 2),
                                                ("bob", "submitter", 0, 0)]:
            html = self.client_for(who).get("/").content.decode()
            assert f'class="role">{role}<' in html, who
            counts = dict(re.findall(r'data-count="(\w+)">.*?</span>(\d+)<', html))
            assert counts == {"approvals": str(approvals), "attention": str(attention)}, who

    def test_it_refuses_a_user_without_a_role(self) -> None:
        response = self.client_for("nobody").get("/")
        assert response.status_code == 403
        assert "nobody may not view runs" in response.content.decode()

    def test_it_lists_the_runs_each_role_may_see_newest_first(self) -> None:
        everyone = [self.bobs, self.scripted, self.stuck, self.failed, self.paused]
        for who, runs in [("charlie", everyone), ("vera", everyone),
                          ("alice", everyone[1:]), ("bob", [self.bobs])]:
            html = self.client_for(who).get("/").content.decode()
            listed = re.findall(r'<tr id="run-([0-9a-f-]+)"', html)
            assert listed == [str(r.code) for r in runs], who

    def test_it_counts_each_status_under_the_other_filters(self) -> None:
        html = self.client_for("vera").get("/", {"agent": "provision",
                                                 "status": "failed"}).content.decode()
        chips = dict(re.findall(r'data-chip="(\w*)">[^<]*<span class="chip-count">(\d+)<',
                                html))
        assert chips[""] == "3" and chips["failed"] == "1" and chips["succeeded"] == "1"
        assert chips["needs_attention"] == "1" and chips["paused"] == "0"
        assert re.findall(r'<tr id="run-([0-9a-f-]+)"', html) == [str(self.failed.code)]
        assert 'aria-current="true" data-chip="failed"' in html

    def test_it_searches_by_run_id_or_input_text(self) -> None:
        client = self.client_for("vera")
        by_code = client.get("/", {"q": str(self.stuck.code)[:8]}).content.decode()
        assert re.findall(r'<tr id="run-([0-9a-f-]+)"', by_code) == [str(self.stuck.code)]
        by_text = client.get("/", {"q": "web-2"}).content.decode()
        assert re.findall(r'<tr id="run-([0-9a-f-]+)"', by_text) == [str(self.failed.code)]
        none = client.get("/", {"q": "no-such-thing"}).content.decode()
        assert "No run matches these filters." in none

    def test_it_filters_by_time_range(self) -> None:
        Run.objects.filter(pk=self.failed.pk).update(
            created_at=timezone.now() - timedelta(days=3))
        client = self.client_for("vera")
        recent = client.get("/", {"range": "24h"}).content.decode()
        assert str(self.failed.code) not in recent and str(self.paused.code) in recent
        assert str(self.failed.code) in client.get("/", {"range": "7d"}).content.decode()
        day = (timezone.now() - timedelta(days=3)).date().isoformat()
        custom = client.get("/", {"range": "custom", "after": day, "before": day,
                                  "tz": "UTC"}).content.decode()
        assert re.findall(r'<tr id="run-([0-9a-f-]+)"', custom) == [str(self.failed.code)]

    def test_it_shows_a_bad_filter_and_ignores_it(self) -> None:
        response = self.client_for("vera").get("/", {"status": "bogus", "after": "yesterday",
                                                     "range": "custom"})
        assert response.status_code == 200
        html = response.content.decode()
        assert "(ignored)" in html and len(re.findall(r'<tr id="run-', html)) == 5

    def test_it_pages_the_list(self) -> None:
        Run.objects.bulk_create([Run(agent="provision", input={"name": f"n-{i}"},
                                     submitted_by=self.bob) for i in range(52)])
        client = self.client_for("bob")
        first = client.get("/").content.decode()
        assert len(re.findall(r'<tr id="run-', first)) == 50
        assert "53 runs · page 1 of 2" in first and 'rel="next" href="?page=2"' in first
        second = client.get("/", {"page": 2}).content.decode()
        assert len(re.findall(r'<tr id="run-', second)) == 3 and 'rel="prev"' in second
        assert str(self.bobs.code) in second
        past_the_end = client.get("/", {"page": 9}).content.decode()
        assert "page 2 of 2" in past_the_end

    def test_it_caps_its_counts(self) -> None:
        """Past ``COUNT_CAP`` a count says "N+" (counting every one of 100 000 runs was a scan
        on each page view, P5), and the pager then knows only whether an older page exists."""
        Run.objects.bulk_create([Run(agent="provision", input={}, status=Run.Status.SUCCEEDED)
                                 for _ in range(3)])
        with mock.patch.object(pages, "COUNT_CAP", 1):
            client = self.client_for("vera")
            html = client.get("/").content.decode()
            counts = client.get("/inbox/counts").json()
        chips = dict(re.findall(r'data-chip="(\w*)">[^<]*<span class="chip-count">(\d+\+?)<',
                                html))
        assert chips["succeeded"] == "1+" and chips[""].endswith("+") and chips["paused"] == "1"
        assert chips["compensated"] == "0"
        assert re.search(r"\d+\+ runs · page 1<", html) and 'rel="next"' not in html
        nav = dict(re.findall(r'data-count="(\w+)">.*?</span>([\d+]+)<', html))
        assert nav == {"approvals": "1", "attention": "1+"}
        assert counts == {"approvals": 1, "attention": 2}  # cap + 1: more than the cap

    def test_it_escapes_agent_input_everywhere(self) -> None:
        for path in ["/", self.url(self.scripted)]:
            html = self.client_for("charlie").get(path).content.decode()
            assert SCRIPT not in html, path
            assert "&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in html, path

    def test_it_shows_a_run_to_whoever_may_see_it_and_no_one_else(self) -> None:
        assert self.client_for("alice").get(self.url(self.paused)).status_code == 200
        assert self.client_for("vera").get(self.url(self.paused)).status_code == 200
        assert self.client_for("bob").get(self.url(self.paused)).status_code == 404
        unknown = f"/runs/{uuid.uuid4()}/"
        assert self.client_for("charlie").get(unknown).status_code == 404

    def test_it_shows_a_failed_run_with_its_steps_error_and_traceback(self) -> None:
        html = self.client_for("vera").get(self.url(self.failed)).content.decode()
        assert 'data-node="create_group" data-status="succeeded"' in html
        assert 'data-node="launch_instance" data-status="failed"' in html
        assert "ProvisioningFailed: disk full" in html
        assert "Traceback (most recent call last):\n  boom" in html
        assert "Why it stopped" in html

    def test_it_shows_compensations_in_order_with_attempts_and_keys(self) -> None:
        html = self.client_for("vera").get(self.url(self.stuck)).content.decode()
        order = re.findall(r'data-compensation="(\w+)" data-status="(\w+)"', html)
        assert order == [("attach_address", "failed"), ("launch_instance", "succeeded")]
        assert "k-address" in html and "k-config" in html
        assert "OSError: registry locked" in html and "Traceback: registry locked" in html

    def test_it_groups_identical_failed_attempts_with_the_raw_error_a_click_away(self) -> None:
        """Five attempts that could not reach Stripe are one row in words; the SDK's message
        is on the page once, inside a <details>, however many attempts raised it."""
        from tests.conftest import _free_port
        from tests.web.dashboard.test_errors import refund_error

        refused = refund_error(f"http://127.0.0.1:{_free_port()}")
        attempts = self.compensation.attempts
        attempts.all().delete()
        start = timezone.now()
        for n in range(1, 6):
            at = start + timedelta(milliseconds=400 * n)
            attempts.create(number=n, started_at=at, finished_at=at, ok=False, error=refused)
        at = start + timedelta(seconds=5)
        attempts.create(number=6, started_at=at, finished_at=at, ok=False,
                        error={"type": "OSError", "message": "registry locked"})
        html = self.client_for("vera").get(self.url(self.stuck)).content.decode()
        rows = re.findall(r'<tr data-attempts="(\d+)">\s*<td class="num">([^<]+)</td>', html)
        # launch_instance's one ok attempt last
        assert rows == [("5", "1\u20135"), ("1", "6"), ("1", "1")]
        assert re.search(r"<strong>5 attempts:</strong> <span class=\"error-summary\">"
                         r"Stripe unreachable \(connection refused\)</span>", html)
        assert "HTTPConnectionPool" not in outside_details(html)
        raw = html[html.index("HTTPConnectionPool") - 600:html.index("HTTPConnectionPool")]
        assert '<details class="raw-error"><summary>The error as raised (each of the 5 times)' \
               in raw and '<pre class="error-raw">APIConnectionError: ' in raw
        assert html.count('<pre class="error-raw">APIConnectionError: ') == 1
        assert '<span class="error-summary">OSError: registry locked</span>' in html

    def test_it_shows_an_invariant_violation_with_the_state_that_broke_it(self) -> None:
        run = Run.objects.create(agent="provision", status=Run.Status.COMPENSATED,
                                 input={"name": "web-9"}, submitted_by=self.alice)
        from tests.web.dashboard.world import step

        step(run, "create_record", 1, "violated",
             state_after={"name": "web-9", "address": "192.0.2.9",
                          "record": {"name": "web-9.stateguard.test.", "value": "192.0.2.1"}},
             error={"type": "InvariantViolation", "traceback": "",
                    "message": "invariant 'record_names_the_address' violated after "
                               "'create_record': The server's DNS record points at its "
                               "Elastic IP."})
        html = self.client_for("vera").get(self.url(run)).content.decode()
        assert "Invariant violated: <code>record_names_the_address</code>" in html
        assert "The server&#x27;s DNS record points at its Elastic IP." in html
        assert "After <strong>create_record</strong>" in html
        assert "&quot;value&quot;: &quot;192.0.2.1&quot;" in html

    def test_it_draws_the_agents_graph_with_each_steps_status(self) -> None:
        html = self.client_for("vera").get(self.url(self.paused)).content.decode()
        svg = graph_svg(html)
        assert re.search(r'class="graph-node st-ok" data-node="create_customer">', svg)
        assert re.search(r'class="graph-node st-wait graph-current" data-node="charge_user">',
                         svg)
        assert "▶ awaiting approval" in svg
        assert re.search(r'class="graph-node st-idle" data-node="book_order">', svg)
        stuck = self.client_for("vera").get(self.url(self.stuck)).content.decode()
        assert 'st-bad" data-node="attach_address"' in stuck  # its undo failed
        assert 'st-undo" data-node="launch_instance"' in stuck

    def test_it_shows_a_step_cut_off_by_a_dead_worker_as_in_doubt_everywhere(self) -> None:
        """Recovery unwound the run (compensated) and the cut-off step stays "started" in the
        journal: the page calls it in doubt (step list, graph, legend), says what that means,
        and what its compensation found; never "running"."""
        from tests.web.dashboard.world import step

        run = Run.objects.create(agent="provision", status=Run.Status.COMPENSATED,
                                 submitted_by=self.alice, input={"name": "web-7"})
        step(run, "create_group", 1)
        cut = step(run, "launch_instance", None, Step.Status.STARTED, finished_at=None)
        Compensation.objects.create(run=run, step=cut, node="launch_instance",
                                    idempotency_key="k-cut",
                                    status=Compensation.Status.NOTHING_TO_UNDO)
        html = self.client_for("vera").get(self.url(run)).content.decode()
        assert 'data-node="launch_instance" data-status="in_doubt"' in html
        badge = re.search(r'<span class="badge st-warn" data-status="in_doubt" title="([^"]+)">'
                          r'<span aria-hidden="true">\?</span> in doubt</span>', html)
        assert badge and "Whether it had its effect is unknown." in badge[1]
        note = re.search(r'<p class="note" data-in-doubt>([^<]+)</p>', html)
        assert note and note[1].endswith("Its compensation looked and found nothing to undo.")
        svg = graph_svg(html)
        node = re.search(r'<g class="graph-node st-warn" data-node="launch_instance"><title>'
                         r'([^<]+)</title>.*?<text class="graph-status"[^>]*>([^<]+)</text>',
                         svg)
        assert node and node[2] == "in doubt · nothing to undo"
        assert node[1].startswith("launch_instance: in doubt · nothing to undo. Started and")
        statuses = re.findall(r'<text class="graph-status"[^>]*>([^<]+)</text>', svg)
        assert not any("running" in words for words in statuses), statuses
        assert 'data-status="started"' not in html
        assert re.search(r'<li title="[^"]+"><span class="swatch st-warn"></span>in doubt</li>',
                         html)

    def test_it_calls_a_started_step_running_while_its_worker_holds_the_run(self) -> None:
        from tests.web.dashboard.world import step

        run = Run.objects.create(agent="provision", status=Run.Status.RUNNING,
                                 submitted_by=self.alice, input={"name": "web-8"},
                                 lease_owner="w1", lease_expires_at=timezone.now()
                                 + timedelta(seconds=30))
        step(run, "create_group", None, Step.Status.STARTED, finished_at=None)
        html = self.client_for("vera").get(self.url(run)).content.decode()
        assert 'data-node="create_group" data-status="started"' in html
        assert "▶ running" in html and "data-in-doubt" not in html
        # Its worker died: the lease ran out, and no one runs the step any more.
        Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now()
                                             - timedelta(seconds=1))
        html = self.client_for("vera").get(self.url(run)).content.decode()
        assert 'data-node="create_group" data-status="in_doubt"' in html
        assert "▶ running" not in html

    def test_it_calls_each_status_the_same_on_its_badge_and_in_the_graph(self) -> None:
        html = self.client_for("vera").get(self.url(self.stuck)).content.decode()
        svg = graph_svg(html)
        for node, words in [("launch_instance", "compensated"),
                            ("attach_address", "compensation failed")]:
            shown = re.search(rf'data-compensation="{node}".*?<span aria-hidden="true">.</span> '
                              r"([^<]+)</span>", html, re.S)
            assert shown and shown[1] == words, node
            assert re.search(rf'data-node="{node}">.*?<text class="graph-status"[^>]*>'
                             rf"{words}</text>", svg), node

    def test_it_shows_effects_when_the_run_has_some(self) -> None:
        from stateguard_web.sagas.models import Effect

        html = self.client_for("vera").get(self.url(self.paused)).content.decode()
        assert "Effects" not in html
        Effect.objects.create(run=self.paused, step_id="t-charge", node="charge_user",
                              provider="stripe", kind="charge", external_id="pi_123",
                              amount=25000, currency="usd", recorded_at=timezone.now())
        html = self.client_for("vera").get(self.url(self.paused)).content.decode()
        assert "pi_123" in html and "250.00 USD" in html and 'data-effect="charge"' in html

    def test_it_says_the_same_of_every_providers_effects_and_which_are_in_doubt(self) -> None:
        from stateguard_web.sagas.models import Effect

        def effect(node: str, provider: str, kind: str, external_id: str, **extra: Any) -> None:
            Effect.objects.create(run=self.stuck, step_id=f"{self.stuck.code}-{node}",
                                  node=node, provider=provider, kind=kind,
                                  external_id=external_id, recorded_at=timezone.now(), **extra)

        # create_group has no compensation yet; launch_instance's undo succeeded and recorded
        # the termination; attach_address's undo failed: its address may be released or not.
        effect("create_group", "ec2", "security_group", "sg-1")
        effect("launch_instance", "ec2", "instance", "i-1", status="compensated")
        effect("launch_instance", "ec2", "termination", "i-1 terminated", undoes="i-1",
               status="compensated")
        effect("attach_address", "ec2", "elastic_ip", "eipalloc-1")
        effect("attach_address", "smtp", "email", "<sg-effect-1@shop.test>")
        html = self.client_for("vera").get(self.url(self.stuck)).content.decode()

        states = re.findall(r'data-provider="(\w+)" data-state="(\w+)">\s*<td><span class="badge '
                            r'st-(\w+)" data-status="\w+" title="([^"]+)"><span aria-hidden="true">'
                            r'.</span> ([^<]+)</span>', html)
        assert [(p, state, css, words) for p, state, css, _, words in states] == [
            ("ec2", "applied", "ok", "applied"),
            ("ec2", "compensated", "undo", "compensated"),
            ("ec2", "undoes", "undo", "undoes"),
            ("ec2", "in_doubt", "warn", "in doubt"),
            ("smtp", "in_doubt", "warn", "in doubt")]
        assert "reconcile_effects" in states[3][3]  # the tooltip says who can tell

    def test_it_shows_the_audit_trail(self) -> None:
        html = self.client_for("vera").get(self.url(self.scripted)).content.decode()
        assert "<code>run.submitted</code>" in html and "<td>alice</td>" in html


class WorkerHealthTests(DashboardWorld):
    """The banner that says no worker is alive, from the heartbeats workers keep in Redis."""

    def setUp(self) -> None:
        self.redis = redis.Redis.from_url(settings.CELERY_BROKER_URL)
        self.redis.delete(heartbeat.KEY)
        self.addCleanup(self.redis.delete, heartbeat.KEY)

    def banner(self, html: str) -> str:
        found = re.search(r'<p class="banner banner-bad" role="alert" data-workers-down>(.*?)'
                          r"</p>", html, re.S)
        return " ".join(re.sub(r"<[^>]+>", "", found[1]).split()) if found else ""

    def test_it_says_on_every_page_that_no_worker_is_alive(self) -> None:
        Run.objects.create(agent="provision", submitted_by=self.alice, input={})
        for path in ["/", self.url(self.paused), "/inbox/approvals/", "/inbox/attention/"]:
            banner = self.banner(self.client_for("vera").get(path).content.decode())
            assert banner.startswith("⚠ No worker is alive: none has sent a heartbeat in the "
                                     "last 1 min. Runs stay pending"), (path, banner)
            assert "1 run waits now" in banner, banner
        assert "0 runs" not in self.banner(self.client_for("bob").get("/").content.decode())

    def test_it_says_nothing_while_a_worker_beats_and_when_the_last_beat_was(self) -> None:
        heartbeat.beat(self.redis, "w1@host")  # what a worker does every 15 s
        assert self.banner(self.client_for("vera").get("/").content.decode()) == ""
        fragment = self.client_for("vera").get("/workers/banner")
        assert fragment.status_code == 200 and 'id="workers-banner"' in fragment.content.decode()
        assert "data-workers-down" not in fragment.content.decode()
        # Its beat was 2 minutes ago: it died (the set's score is the Redis server's clock).
        (now, micro) = self.redis.time()
        self.redis.zadd(heartbeat.KEY, {"w1@host": now + micro / 1e6 - 120})
        banner = self.banner(self.client_for("vera").get("/workers/banner").content.decode())
        assert "(the last one 2 min ago)." in banner, banner

    def test_it_says_when_the_broker_does_not_answer(self) -> None:
        from tests.conftest import _free_port

        with self.settings(CELERY_BROKER_URL=f"redis://127.0.0.1:{_free_port()}/0"):
            banner = self.banner(self.client_for("vera").get("/").content.decode())
        assert banner.startswith("⚠ The broker (Redis) does not answer: workers cannot take "
                                 "runs from it"), banner

    def test_it_shows_how_long_a_pending_run_has_waited(self) -> None:
        run = Run.objects.create(agent="provision", submitted_by=self.alice, input={})
        Run.objects.filter(pk=run.pk).update(created_at=timezone.now() - timedelta(seconds=75))
        html = self.client_for("vera").get("/").content.decode()
        row = html[html.index(f'<tr id="run-{run.code}"'):]
        assert re.search(r'<span class="waited" data-waited-since="[^"]+">waiting 1 min 1[5-9] s'
                         r"</span>", row[:row.index("</tr>")])
        assert html.count("data-waited-since") == 1  # the pending run's only
        page = self.client_for("vera").get(self.url(run)).content.decode()
        assert "the run waits for a worker (<span class=\"waited\"" in page

    def test_it_answers_the_banner_to_those_who_see_runs_only(self) -> None:
        assert Client().get("/workers/banner").status_code == 302
        assert self.client_for("nobody").get("/workers/banner").status_code == 403


class ButtonTests(DashboardWorld):
    EXPECTED = {  # the actions an operator is offered, by run
        "paused": ["approve", "compensate", "reject"],
        "failed": ["compensate", "retry"],
        "stuck": ["compensate", "compensations/{comp}/retry", "resolve"],
        "scripted": ["compensate"],
    }

    def test_it_offers_an_operator_the_actions_the_run_accepts(self) -> None:
        for name, expected in self.EXPECTED.items():
            html = self.client_for("charlie").get(self.url(getattr(self, name))).content.decode()
            wanted = [e.format(comp=self.compensation.pk) for e in expected]
            assert actions_on(html) == sorted(wanted), name

    def test_it_shows_no_action_to_a_viewer_or_a_submitter(self) -> None:
        for who in ["vera", "alice"]:
            for name in self.EXPECTED:
                html = self.client_for(who).get(self.url(getattr(self, name))).content.decode()
                assert actions_on(html) == [], (who, name)
                assert "<dialog" not in html and "data-dialog" not in html, (who, name)

    def test_it_offers_no_compensation_past_a_pivot_and_badges_the_kinds(self) -> None:
        now = timezone.now()
        Step.objects.create(run=self.stuck, step_id="t-ship", node="ship_order", kind="pivot",
                            status=Step.Status.SUCCEEDED, started_at=now, finished_at=now)
        Step.objects.create(run=self.stuck, step_id="t-mail", node="send_email",
                            kind="retriable", status=Step.Status.FAILED, started_at=now)
        html = self.client_for("charlie").get(self.url(self.stuck)).content.decode()
        assert actions_on(html) == sorted([f"compensations/{self.compensation.pk}/retry",
                                           "resolve"])
        assert "data-past-pivot" in html and "passed its pivot &#x27;ship_order&#x27;" in html
        assert 'data-kind="pivot"' in html and 'data-kind="retriable"' in html
        assert 'data-kind="compensatable"' not in html  # the default needs no badge

    def test_it_offers_a_retry_forward_to_a_run_held_past_its_pivot(self) -> None:
        now = timezone.now()
        held = Run.objects.create(
            agent="provision", status=Run.Status.NEEDS_ATTENTION, submitted_by=self.alice,
            input={"name": "web-4"}, error={"type": "ConnectionError", "message": "smtp down",
                                            "traceback": ""})
        for step_id, node, kind, status in [
                ("t-ws", "create_group", "compensatable", Step.Status.SUCCEEDED),
                ("t-ship", "ship_order", "pivot", Step.Status.SUCCEEDED),
                ("t-mail", "send_email", "retriable", Step.Status.FAILED)]:
            Step.objects.create(run=held, step_id=step_id, node=node, kind=kind, status=status,
                                attempt=3 if kind == "retriable" else 1, started_at=now)

        html = self.client_for("charlie").get(self.url(held)).content.decode()
        assert actions_on(html) == ["resolve", "retry"]  # no compensate past the pivot
        assert "Retry from the failure…" in html and "Compensate now…" not in html
        assert ("passed its pivot &#x27;ship_order&#x27; (the point of no return): compensate "
                "would undo") in html and "(retry it, or resolve it by hand)" in html
        forward = re.search(r"<p data-forward>(.*?)</p>", html, re.S)
        assert forward is not None and "<strong>ship_order</strong>" in forward[1]
        assert "<strong>send_email</strong> runs again (attempt 4)" in html
        assert self.client_for("vera").get(self.url(held)).content.decode().count(
            "data-forward") == 0  # a viewer is offered nothing

    def test_it_offers_nothing_while_a_request_waits_for_a_worker(self) -> None:
        Run.objects.filter(pk=self.failed.pk).update(
            request={"id": "r1", "action": "retry", "by": "dora"}, requested_at=timezone.now())
        html = self.client_for("charlie").get(self.url(self.failed)).content.decode()
        assert actions_on(html) == []
        assert 'data-request="retry by dora"' in html
        listed = self.client_for("charlie").get("/").content.decode()
        assert "waiting for a worker: retry by dora" in listed

    def test_it_says_what_approving_charges_and_what_compensating_undoes_in_order(self) -> None:
        html = self.client_for("charlie").get(self.url(self.paused)).content.decode()
        approve = html[html.index('id="confirm-approve-'):]
        approve = approve[:approve.index("</dialog>")]
        assert "it charges <strong class=\"amount\">250.00 USD</strong>" in approve
        assert f'name="approval" value="{self.approval.pk}"' in approve
        stuck = self.client_for("charlie").get(self.url(self.stuck)).content.decode()
        compensate = stuck[stuck.index('id="confirm-compensate"'):]
        compensate = compensate[:compensate.index("</dialog>")]
        # Newest step first; launch_instance's undo already succeeded, so it is not run again.
        planned = re.findall(r"<li[^>]*>undo <strong>(\w+)</strong>", compensate)
        assert planned == ["attach_address", "create_group"]
        resolve = stuck[stuck.index('id="confirm-resolve"'):]
        assert "not the ones left failed: <strong>attach_address</strong>" in resolve

    def test_a_tool_calls_approval_shows_the_tool_and_what_its_arguments_charge(self) -> None:
        """An AI agent's tool call waits with the model's arguments (stateguard.tools), not a
        node's state: the operator sees which tool, the amount and the customer."""
        self.approval.node = "charge_card"
        self.approval.payload = {"tool": "charge_card", "tool_call_id": "call_1",
                                 "args": {"amount": 4200, "currency": "eur", "email": "x@y.z"}}
        self.approval.save()
        html = self.client_for("charlie").get(self.url(self.paused)).content.decode()
        assert "The agent's call of <code>charge_card</code> waits for an approval" in html
        assert ("The call charges <strong class=\"amount\">42.00 EUR</strong> to "
                "<strong>x@y.z</strong>") in html
        assert "The arguments the model gave it" in html
        approve = html[html.index('id="confirm-approve-'):]
        approve = approve[:approve.index("</dialog>")]
        assert "calls the tool <strong>charge_card</strong> for this" in approve
        assert "it charges <strong class=\"amount\">42.00 EUR</strong>" in approve
        inbox = self.client_for("charlie").get("/inbox/approvals/").content.decode()
        assert "42.00 EUR</strong> to x@y.z" in inbox

    def test_it_opens_a_confirmation_without_script_from_the_buttons_get(self) -> None:
        html = self.client_for("charlie").get(self.url(self.failed),
                                              {"confirm": "retry"}).content.decode()
        assert re.search(r'<dialog id="confirm-retry" [^>]*open>', html)
        assert "<strong>launch_instance</strong> runs again (attempt 2)" in html


class ActionTests(DashboardWorld):
    def post(self, who: str, run: Run, action: str, data: dict[str, object] | None = None,
             ) -> object:
        return self.client_for(who).post(self.url(run, action), data or {})

    def cases(self) -> list[tuple[Run, str, dict[str, object]]]:
        return [(self.paused, "approve", {"approval": self.approval.pk}),
                (self.paused, "reject", {"approval": self.approval.pk, "reason": "no"}),
                (self.failed, "retry", {}),
                (self.failed, "compensate", {"reason": "customer asked"}),
                (self.stuck, "resolve", {"note": "refunded by hand"}),
                (self.stuck, f"compensations/{self.compensation.pk}/retry", {})]

    def test_it_refuses_every_action_to_a_viewer_or_a_submitter_and_changes_nothing(self) -> None:
        for who in ["vera", "alice", "bob"]:
            for run, action, data in self.cases():
                before = journal_state()
                response = self.post(who, run, action, data)
                assert response.status_code == 403, (who, action)  # type: ignore[attr-defined]
                assert journal_state() == before, (who, action)

    def test_it_refuses_every_action_without_the_csrf_token(self) -> None:
        for run, action, data in self.cases():
            before = journal_state()
            client = self.client_for("charlie", csrf=True)
            assert client.post(self.url(run, action), data).status_code == 403, action
            assert journal_state() == before, action

    def test_it_refuses_a_get_on_an_action(self) -> None:
        response = self.client_for("charlie").get(self.url(self.failed, "retry"))
        assert response.status_code == 405

    def test_it_carries_out_each_action_for_an_operator_with_one_audit_event(self) -> None:
        expected = {"approve": ("approve", "run.approved"), "reject": ("reject", "run.rejected"),
                    "retry": ("retry", "run.retry_requested"),
                    "compensate": ("compensate", "run.compensate_requested"),
                    "resolve": (None, "run.resolved_by_hand"),
                    "retry_compensation": ("retry_compensation",
                                           "compensation.retry_requested")}
        for run, action, data in self.cases():
            name = "retry_compensation" if action.startswith("compensations/") else action
            with self.subTest(action=name):
                sid = self.savepoint()
                audit = AuditEvent.objects.count()
                client = self.client_for("charlie", csrf=True)
                client.get(self.url(run))
                response = client.post(self.url(run, action), {
                    **data, "csrfmiddlewaretoken": client.cookies["csrftoken"].value},
                    follow=True)
                assert response.redirect_chain == [(self.url(run), 302)]
                html = response.content.decode()
                assert "message-success" in html, html[:3000]
                run.refresh_from_db()
                request, audited = expected[name]
                assert (run.request or {}).get("action") == request
                assert AuditEvent.objects.count() == audit + 1
                event = AuditEvent.objects.latest("pk")
                assert (event.actor, event.action) == ("charlie", audited)
                if request:  # the page says a worker has yet to take it up
                    assert f'data-request="{request} by charlie"' in html
                self.rollback(sid)

    def test_it_approves_the_very_approval_that_was_shown(self) -> None:
        Approval.objects.filter(pk=self.approval.pk).update(
            status=Approval.Status.APPROVED, decided_by="dora")
        before = journal_state()
        response = self.client_for("charlie").post(self.url(self.paused, "approve"),
                                                   {"approval": self.approval.pk}, follow=True)
        assert "The approval of charge_user is no longer pending: it was approved by dora." \
            in response.content.decode()
        assert journal_state() == before
        other = Approval.objects.create(run=self.failed, step_id="x", node="create_record",
                                        requested_at=timezone.now())
        response = self.client_for("charlie").post(self.url(self.paused, "approve"),
                                                   {"approval": other.pk}, follow=True)
        assert f"has no approval {other.pk}" in response.content.decode()

    def test_it_shows_the_state_machines_refusal_and_changes_nothing(self) -> None:
        before = journal_state()
        response = self.client_for("charlie").post(self.url(self.paused, "retry"), follow=True)
        html = response.content.decode()
        assert (f"run {self.paused.code} is paused; only a failed run, or one held past its "
                "pivot, is retried") in html
        assert 'class="message message-error" role="alert"' in html
        assert journal_state() == before

    def test_it_wants_a_note_to_resolve_by_hand(self) -> None:
        before = journal_state()
        response = self.client_for("charlie").post(self.url(self.stuck, "resolve"),
                                                   {"note": "  "}, follow=True)
        assert "the note is required" in response.content.decode()
        assert journal_state() == before

    def test_it_hides_a_run_from_a_submitter_who_did_not_submit_it(self) -> None:
        # bob is no operator (403 first), and an operator's unknown run is a 404.
        response = self.client_for("charlie").post(f"/runs/{uuid.uuid4()}/retry")
        assert response.status_code == 404

    def savepoint(self) -> str:
        from django.db import transaction

        return str(transaction.savepoint())

    def rollback(self, sid: str) -> None:
        from django.db import transaction

        transaction.savepoint_rollback(sid)


class InboxTests(DashboardWorld):
    def test_it_lists_the_approvals_waiting_oldest_first(self) -> None:
        later = Run.objects.create(agent="checkout", status=Run.Status.PAUSED,
                                   submitted_by=self.bob, input={"amount": 99999})
        Approval.objects.create(run=later, step_id="s2", node="charge_user",
                                requested_at=timezone.now() + timedelta(minutes=5),
                                payload={"state": {"amount": 99999, "currency": "eur"}})
        html = self.client_for("charlie").get("/inbox/approvals/").content.decode()
        assert re.findall(r'<tr id="run-([0-9a-f-]+)"', html) == [str(self.paused.code),
                                                                  str(later.code)]
        assert "250.00 USD" in html and "999.99 EUR" in html
        bobs = self.client_for("bob").get("/inbox/approvals/").content.decode()
        assert re.findall(r'<tr id="run-([0-9a-f-]+)"', bobs) == [str(later.code)]

    def test_it_lists_the_runs_that_need_attention_oldest_first(self) -> None:
        Run.objects.filter(pk=self.stuck.pk).update(updated_at=timezone.now() - timedelta(1))
        html = self.client_for("vera").get("/inbox/attention/").content.decode()
        assert re.findall(r'<tr id="run-([0-9a-f-]+)"', html) == [str(self.stuck.code),
                                                                  str(self.failed.code)]
        assert "undo of <strong>attach_address</strong>" in html
        assert "ProvisioningFailed: disk full" in html
        empty = self.client_for("bob").get("/inbox/attention/").content.decode()
        assert "No run needs attention." in empty

    def test_it_answers_the_counts_as_json(self) -> None:
        assert self.client_for("vera").get("/inbox/counts").json() == {"approvals": 1,
                                                                       "attention": 2}
        assert self.client_for("bob").get("/inbox/counts").json() == {"approvals": 0,
                                                                      "attention": 0}
        assert Client().get("/inbox/counts").status_code == 302
