"""GET /api/workers, /api/queue and /api/queue/throughput: what the workers page shows, as
JSON, in the OpenAPI schema. Who may call them is in test_access.py's table."""

from __future__ import annotations

from datetime import timedelta

import redis
from django.conf import settings
from django.utils import timezone

from stateguard_web.monitoring import heartbeat
from stateguard_web.runs import queue
from stateguard_web.sagas.models import Run
from tests.web.api.world import World


class WorkersApiTests(World):
    def setUp(self) -> None:
        self.redis = redis.Redis.from_url(settings.CELERY_BROKER_URL)
        keys = (heartbeat.KEY, heartbeat.INFO_KEY, queue.name())
        self.redis.delete(*keys)
        self.addCleanup(self.redis.delete, *keys)

    def test_it_lists_each_worker_with_the_runs_it_holds(self) -> None:
        heartbeat.beat(self.redis, "w1@host-a", heartbeat.WorkerInfo(
            host="host-a", pid=10, pids=(10, 11), concurrency=1, pool="prefork",
            version="1.2.3"))
        held = Run.objects.create(agent="checkout", status=Run.Status.RUNNING,
                                  lease_owner="host-a:11:ab12")

        body = self.call("vera", "GET", "/api/workers").json()

        assert body["broker_ok"] is True and body["alive"] == 1 and body["unclaimed"] == []
        (worker,) = body["workers"]
        assert {k: worker[k] for k in ("name", "host", "pid", "pids", "concurrency", "pool",
                                       "version", "alive")} == {
            "name": "w1@host-a", "host": "host-a", "pid": 10, "pids": [10, 11],
            "concurrency": 1, "pool": "prefork", "version": "1.2.3", "alive": True}
        assert worker["last_heartbeat_seconds_ago"] < 5
        assert worker["runs"] == [{"code": str(held.code), "agent": "checkout",
                                   "status": "running", "lease_owner": "host-a:11:ab12"}]

    def test_it_reads_the_queue_and_its_oldest_pending_run(self) -> None:
        self.redis.rpush(queue.name(), "m1")
        run = Run.objects.create(agent="provision", input={"name": "x"})
        Run.objects.filter(pk=run.pk).update(created_at=timezone.now() - timedelta(minutes=10))

        body = self.call("charlie", "GET", "/api/queue").json()

        assert body["depth"] == 1 and body["pending"] == 1 and body["backlogged"] is True
        assert body["backlog_warn_seconds"] == 300
        oldest = body["oldest_pending"]
        assert oldest["code"] == str(run.code) and 599 < oldest["waited_seconds"] < 610

    def test_it_counts_runs_per_minute_and_refuses_a_window_out_of_range(self) -> None:
        Run.objects.create(agent="checkout", status=Run.Status.SUCCEEDED)

        body = self.call("vera", "GET", "/api/queue/throughput?minutes=5").json()

        assert len(body["minutes"]) == 5
        now = body["minutes"][-1]
        assert now["submitted"] >= 1 and now["started"] >= 1 and now["succeeded"] >= 1
        for bad in ("0", "1441", "x"):
            answer = self.call("vera", "GET", f"/api/queue/throughput?minutes={bad}")
            assert answer.status_code == 422 and answer.json()["code"] == "invalid", bad

    def test_it_documents_them_in_the_openapi_schema(self) -> None:
        paths = self.client.get("/api/openapi.json").json()["paths"]
        assert {"/api/workers", "/api/queue", "/api/queue/throughput"} <= set(paths)
        assert paths["/api/workers"]["get"]["operationId"] == "list_workers"
