"""The workers page and what it reads (issue 23 §1): each worker from its heartbeat with the
runs it holds, the queue's depth and its oldest pending run, runs per minute; the header's
warning when the queue is behind. Through Django's test client, with the test Redis."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from unittest import mock

import redis
from django.conf import settings
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from stateguard_web.dashboard import chart
from stateguard_web.monitoring import heartbeat
from stateguard_web.monitoring import workers as monitoring
from stateguard_web.runs import queue
from stateguard_web.sagas.models import Run
from tests.web.dashboard.world import DashboardWorld

WORKER = heartbeat.WorkerInfo(host="host-a", pid=100, pids=(100, 101, 102), concurrency=2,
                              pool="prefork", version="9.9.9+gdeadbee", started_at=1.0)


class RedisWorld(DashboardWorld):
    """The dashboard's world, and the test Redis's heartbeats and queue emptied around each
    test."""

    def setUp(self) -> None:
        self.redis = redis.Redis.from_url(settings.CELERY_BROKER_URL)
        keys = (heartbeat.KEY, heartbeat.INFO_KEY, queue.name())
        self.redis.delete(*keys)
        self.addCleanup(self.redis.delete, *keys)

    def beat_at(self, name: str, seconds_ago: float, info: heartbeat.WorkerInfo) -> None:
        """A beat of ``name`` as if it came ``seconds_ago`` (the set's score is the Redis
        server's clock)."""
        heartbeat.beat(self.redis, name, info)
        now, micro = self.redis.time()
        self.redis.zadd(heartbeat.KEY, {name: now + micro / 1e6 - seconds_ago})

    def running(self, owner: str, agent: str = "checkout") -> Run:
        return Run.objects.create(agent=agent, status=Run.Status.RUNNING, lease_owner=owner,
                                  submitted_by=self.alice)


class SelectorTests(RedisWorld):
    def test_it_sets_started_at_once_when_a_run_leaves_pending(self) -> None:
        run = Run.objects.create(agent="checkout", submitted_by=self.alice)
        stale = Run.objects.get(pk=run.pk)  # loaded while pending
        assert run.started_at is None
        Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)  # as the journal does
        started = Run.objects.get(pk=run.pk).started_at
        assert started is not None and abs(started - timezone.now()) < timedelta(seconds=5)
        Run.objects.filter(pk=run.pk).update(status=Run.Status.FAILED)
        Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)  # a retry
        stale.status = Run.Status.SUCCEEDED
        stale.save()  # a stale object writes started_at=None back: the trigger keeps it
        assert Run.objects.get(pk=run.pk).started_at == started

    def test_it_maps_each_leased_run_to_the_worker_whose_process_holds_it(self) -> None:
        self.beat_at("w1@host-a", 3, WORKER)
        self.beat_at("w0@host-a", 600, heartbeat.WorkerInfo(host="host-a", pids=(200,)))
        mine = self.running("host-a:101:aaaa")
        other = self.running("host-a:102:bbbb", agent="provision")
        dead = self.running("host-a:200:cccc")  # the gone worker's: unclaimed
        foreign = self.running("laptop:7:dddd")  # a manage.py elsewhere
        Run.objects.create(agent="checkout", status=Run.Status.PAUSED, submitted_by=self.alice,
                           lease_owner="host-a:101:eeee")  # not live: not held

        state = monitoring.workers_snapshot()

        assert state.broker_ok and [w.name for w in state.workers] == ["w1@host-a", "w0@host-a"]
        w1, w0 = state.workers
        assert w1.alive and not w0.alive and w1.info == WORKER
        assert 2 < w1.last_beat_age < 10
        assert {r.code for r in w1.runs} == {str(mine.code), str(other.code)}
        assert w0.runs == []
        assert {r.code for r in state.unclaimed} == {str(dead.code), str(foreign.code)}

    def test_it_forgets_a_worker_with_its_info(self) -> None:
        heartbeat.beat(self.redis, "w1@host-a", WORKER)
        heartbeat.forget(self.redis, "w1@host-a")
        assert monitoring.workers_snapshot().workers == []
        assert not self.redis.hexists(heartbeat.INFO_KEY, "w1@host-a")

    def test_it_reads_a_beat_without_info_as_unknown(self) -> None:
        heartbeat.beat(self.redis, "old@host")  # code from before the info, or garbage in it
        self.redis.hset(heartbeat.INFO_KEY, "odd@host", '{"pid": "x", "pids": [1, "2"]')
        heartbeat.beat(self.redis, "odd@host")
        (first, second) = monitoring.workers_snapshot().workers
        assert first.info == second.info == heartbeat.WorkerInfo()

    def test_it_reads_the_queue_depth_and_the_oldest_pending_run(self) -> None:
        self.redis.rpush(queue.name(), "m1", "m2", "m3")
        old = Run.objects.create(agent="provision", submitted_by=self.bob)
        Run.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(minutes=7))
        Run.objects.create(agent="checkout", submitted_by=self.alice)

        state = monitoring.queue_snapshot()

        assert (state.depth, state.pending, state.oldest_code) == (3, 2, str(old.code))
        assert 419 < (state.oldest_age or 0) < 430 and state.backlogged  # past 300 s
        with self.settings(STATEGUARD_BACKLOG_WARN_SECONDS=3600):
            assert not monitoring.queue_snapshot().backlogged

    def test_it_counts_runs_per_minute_by_what_happened_in_each(self) -> None:
        now = datetime(2030, 1, 1, 12, 30, 40, tzinfo=UTC)

        def made(minutes_ago: float, status: str, started: float | None,
                 finished: float | None) -> None:
            at = {"started_at": None if started is None else now - timedelta(minutes=started),
                  "finished_at": None if finished is None else now - timedelta(minutes=finished)}
            run = Run.objects.create(agent="checkout", status=status, **at)
            Run.objects.filter(pk=run.pk).update(created_at=now - timedelta(minutes=minutes_ago))

        made(0.2, Run.Status.PENDING, None, None)  # this minute (12:30)
        made(5, Run.Status.SUCCEEDED, 4, 3)
        made(5, Run.Status.COMPENSATED, 5, 0.1)
        made(59, Run.Status.NEEDS_ATTENTION, 59, 58)  # 11:31: the window's first minute
        made(61, Run.Status.SUCCEEDED, 61, 61)  # before the window

        rate = monitoring.throughput(60, now=now)

        assert len(rate.minutes) == 60 and rate.minutes[-1] == now.replace(second=0)
        assert rate.minutes[0] == datetime(2030, 1, 1, 11, 31, tzinfo=UTC)
        at = {m: i for i, m in enumerate(rate.minutes)}

        def minute(hh: int, mm: int) -> int:
            return at[datetime(2030, 1, 1, hh, mm, tzinfo=UTC)]

        assert rate.counts["submitted"][minute(12, 30)] == 1
        assert rate.counts["submitted"][minute(12, 25)] == 2
        assert rate.counts["started"][minute(12, 26)] == 1
        assert rate.counts["started"][minute(12, 25)] == 1
        assert rate.counts["succeeded"][minute(12, 27)] == 1
        assert rate.counts["compensated"][minute(12, 30)] == 1
        assert rate.counts["needs_attention"][minute(11, 32)] == 1
        assert rate.counts["started"][minute(11, 31)] == 1
        assert {name: rate.total(name) for name in monitoring.SERIES} == {
            "submitted": 4, "started": 3, "succeeded": 1, "compensated": 1,
            "needs_attention": 1}


    def test_it_reads_a_minute_that_is_over_once_per_process(self) -> None:
        settled = monitoring._SettledMinutes()
        with mock.patch.object(monitoring, "_settled", settled):
            first = monitoring.throughput(10)
            run = Run.objects.create(agent="checkout", status=Run.Status.SUCCEEDED)
            Run.objects.filter(pk=run.pk).update(  # as if submitted 5 minutes ago, too late
                created_at=timezone.now() - timedelta(minutes=5))
            Run.objects.create(agent="checkout")  # this minute: read at every call
            with CaptureQueriesContext(connection) as queries:
                second = monitoring.throughput(10)
        # The run moved 5 minutes back is not seen: that minute was over, and read already.
        assert second.counts["submitted"][:-1] == first.counts["submitted"][:-1]
        assert second.counts["submitted"][-1] >= 1
        assert len(queries) == 3  # submitted, started, finished: since the settled minutes
        fresh = monitoring.throughput(10, now=timezone.now())  # everything read: seen
        assert fresh.total("submitted") > second.total("submitted")


class ChartTests(RedisWorld):
    def test_it_scales_the_lines_to_a_round_top_and_labels_the_minutes_back(self) -> None:
        assert [chart.nice_ceiling(v) for v in (1, 3, 7, 10, 11, 240, 5001)] == [
            1, 5, 10, 10, 20, 500, 10000]
        minutes = [datetime(2030, 1, 1, 12, m, tzinfo=UTC) for m in range(5)]
        counts = {name: [0] * 5 for name in monitoring.SERIES}
        counts["started"] = [0, 3, 7, 0, 1]
        drawn = chart.runs_per_minute(monitoring.Throughput(minutes, counts))
        started = next(line for line in drawn.lines if line.name == "started")
        points = [tuple(map(float, p.split(","))) for p in started.points.split()]
        assert points == [(0, 200), (250, 140), (500, 60), (750, 200), (1000, 180)]  # of 10
        assert drawn.y_labels == ["10", "5", "0"] and drawn.grid == [0, 100, 200]
        assert drawn.x_labels == [f"\N{MINUS SIGN}{m} min" for m in (4, 3, 2, 1)] + ["now"]
        assert drawn.rows[0] == ("12:04", [0, 1, 0, 0, 0]) and not drawn.empty


def worker_rows(html: str) -> list[str]:
    return re.findall(r'<tr data-worker="([^"]+)"', html)


class PageTests(RedisWorld):
    def test_it_shows_workers_queue_and_chart_to_a_viewer_without_actions(self) -> None:
        self.beat_at("w1@host-a", 2, WORKER)
        held = self.running("host-a:101:aaaa")
        self.redis.rpush(queue.name(), "m1", "m2")

        response = self.client_for("vera").get("/workers/")

        html = response.content.decode()
        assert response.status_code == 200
        assert worker_rows(html) == ["w1@host-a"]
        assert "host-a" in html and "101, 102" in html and "9.9.9+gdeadbee" in html
        assert "data-version-differs" in html  # not the code this server runs
        assert f'href="/runs/{held.code}/"' in html
        assert re.search(r"data-depth>2<", html) and re.search(r"data-pending>0<", html)
        assert html.count("<polyline") == 5 and 'role="img"' in html
        assert "\N{MINUS SIGN}59 min" in html and "\N{MINUS SIGN}30 min" in html
        assert re.findall(r"<form\b[^>]*>", html) == [  # the log-out form alone
            '<form method="post" action="/logout/" class="inline">']
        assert 'aria-current="page">Workers</a>' in html

    def test_it_answers_only_those_who_see_every_run(self) -> None:
        assert Client().get("/workers/").status_code == 302
        assert self.client_for("nobody").get("/workers/").status_code == 403
        assert self.client_for("bob").get("/workers/").status_code == 403  # a submitter
        assert self.client_for("charlie").get("/workers/").status_code == 200
        assert ">Workers</a>" not in self.client_for("bob").get("/").content.decode()
        assert ">Workers</a>" in self.client_for("vera").get("/").content.decode()

    def test_it_says_when_the_broker_does_not_answer(self) -> None:
        from tests.conftest import _free_port

        with self.settings(CELERY_BROKER_URL=f"redis://127.0.0.1:{_free_port()}/0"):
            html = self.client_for("vera").get("/workers/").content.decode()
        assert "data-broker-down" in html and "data-depth>unknown<" in html


class BacklogBannerTests(RedisWorld):
    """The header's warning: workers beat, but the oldest pending run waits too long."""

    def banner(self, html: str) -> str:
        found = re.search(r'<p class="banner banner-warn" role="alert" data-backlog>(.*?)</p>',
                          html, re.S)
        return " ".join(re.sub(r"<[^>]+>", "", found[1]).split()) if found else ""

    def test_it_warns_on_every_page_when_the_oldest_pending_run_waits_too_long(self) -> None:
        heartbeat.beat(self.redis, "w1@host-a", WORKER)
        run = Run.objects.create(agent="provision", submitted_by=self.alice)
        Run.objects.filter(pk=run.pk).update(created_at=timezone.now() - timedelta(minutes=6))
        for path in ["/", self.url(self.paused), "/inbox/attention/", "/workers/",
                     "/workers/banner"]:
            banner = self.banner(self.client_for("vera").get(path).content.decode())
            assert banner.startswith("⚠ The queue is behind: the oldest pending run has waited "
                                     "6 min"), (path, banner)
            assert "more than 5 min, with 1 run pending." in banner, banner
            assert "See the workers and the queue." in banner
        # alice's own run: she is told, without the link to a page she may not open
        banner = self.banner(self.client_for("alice").get("/").content.decode())
        assert banner.startswith("⚠ The queue is behind") and "See the workers" not in banner
        assert self.banner(self.client_for("bob").get("/").content.decode()) == ""  # none his
        with self.settings(STATEGUARD_BACKLOG_WARN_SECONDS=3600):
            assert self.banner(self.client_for("vera").get("/").content.decode()) == ""

    def test_it_leaves_the_no_worker_banner_alone(self) -> None:
        run = Run.objects.create(agent="provision", submitted_by=self.alice)
        Run.objects.filter(pk=run.pk).update(created_at=timezone.now() - timedelta(minutes=6))
        html = self.client_for("vera").get("/").content.decode()
        assert "data-workers-down" in html and self.banner(html) == ""
