"""What the webhooks' outbox trigger (webhooks migration 0002) costs a status change of a run
that has no webhook (most runs): the same UPDATE timed with the trigger and with it disabled,
2000 runs, in one transaction (no disk flush in the figure), best of 3, twice each way,
after a warm-up.

    createdb -h 127.0.0.1 -U postgres sg_bench_hooks
    DEBUG=true DATABASE_URL=postgres://postgres@127.0.0.1:5432/sg_bench_hooks \
        .venv/bin/python manage.py migrate -v0
    DEBUG=true DATABASE_URL=postgres://postgres@127.0.0.1:5432/sg_bench_hooks \
        .venv/bin/python manage.py shell -c "import bench.webhooks_trigger"
    dropdb -h 127.0.0.1 -U postgres sg_bench_hooks

It deletes every run of that database first: never point it at one you keep.
"""

from __future__ import annotations

import time

from django.db import connection, transaction

from stateguard_web.sagas.models import Run

N = 2000
Run.objects.all().delete()
Run.objects.bulk_create([Run(agent="provision", status="running") for _ in range(N)])
ids = list(Run.objects.values_list("pk", flat=True))


def rounds(label: str | None) -> None:
    best: float | None = None
    for _ in range(3):
        Run.objects.update(status="running")
        t = time.perf_counter()
        with transaction.atomic(), connection.cursor() as c:
            for pk in ids:
                c.execute("UPDATE sagas_run SET status = 'succeeded' WHERE id = %s", [pk])
        took = time.perf_counter() - t
        best = took if best is None else min(best, took)
    assert best is not None
    if label is not None:
        print(f"{label}: {best / N * 1e6:.1f} us per status change (best of 3, {N} runs)")


rounds(None)  # warm up: the first rounds on new rows are slower whatever the trigger
for _ in range(2):
    rounds("with the trigger")
    with connection.cursor() as c:
        c.execute("ALTER TABLE sagas_run DISABLE TRIGGER webhooks_run_event")
    rounds("without it")
    with connection.cursor() as c:
        c.execute("ALTER TABLE sagas_run ENABLE TRIGGER webhooks_run_event")
