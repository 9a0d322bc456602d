"""P4 (issue 22): from SIGKILL of a worker to the start of recovery, and what a stopped worker
loses; the lease alone and with process locks, side by side in one run.

    .venv/bin/python bench/p4_takeover.py [--kills 20] [--stalls 5] [--stall-seconds 20]

Everything it uses is its own, started here and stopped at the end: the PostgreSQL database
``stateguard_p4`` (dropped, created and migrated), Redis database ``--redis-db`` (4, flushed:
not at the same time as ``r1_chaos.py``), localstripe (in memory) behind a relay, one beat (the
sweeper) and one rescuer worker of 2 processes, never stopped, with production's settings
(DEBUG off, a 10 s lease renewed every 3 s, a sweep every 2 s, unless ``--lease``). Each trial
starts a victim worker of its own (one process, on a queue of its own, so that the run is its)
in one of two ways, taken in turn so that both see the same machine:

- ``lock``: ``STATEGUARD_WORKER_LOCK`` on (the default): its leases name its process lock;
- ``lease``: off: the lease alone, as before process locks (and on SQLite).

Kills (``--kills`` each way): the victim takes a provision run that sleeps two minutes in
``attach_address`` and is SIGKILLed there, its whole process group (the host died). Measured:
from the kill to the sweep handing the run over (its ``requeued_at``) and to recovery starting
(its ``run.recovering`` audit event, written by the rescuer), both on this host's clock.

Stalls (``--stalls`` each way): the victim takes a checkout; the relay holds Stripe's answer to
the charge (Stripe charged), the victim is stopped (SIGSTOP, its group: its lease heartbeat
too), the answer released into its socket, and ``--stall-seconds`` later it goes on (SIGCONT).
Counted: takeovers (``run.recovering`` events), the outcome, whether the stopped worker was
fenced out when it woke (its log), and from localstripe's own objects the run's charges and
refunds: no effect may happen twice.

Exit status 1 if an effect happened twice, or the ``lock`` way missed P4 (median ≤ 5 s and max
≤ 8 s from SIGKILL to recovery start; 0 takeovers of a stopped worker). Logs and
``report.json`` go to ``--log-dir`` (default: a new folder under /tmp, printed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "stateguard_p4"
STRIPE_KEY = "sk_test_p4"
VICTIM_QUEUE = "p4-victim"
HOLD_CHARGE = b"POST /v1/payment_intents"
WAYS = {"lock": "true", "lease": "false"}  # the victim's STATEGUARD_WORKER_LOCK
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs each way")
    parser.add_argument("--stalls", type=int, default=5, help="SIGSTOPs each way")
    parser.add_argument("--stall-seconds", type=float, default=20.0)
    parser.add_argument("--lease", default="",
                        help="LEASE,RENEW,SWEEP seconds (default: the settings' own)")
    parser.add_argument("--redis-db", type=int, default=4)
    parser.add_argument("--log-dir", type=Path, default=None)
    args = parser.parse_args()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # through the cleanup below
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="p4-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    # Production settings: DEBUG off; no .env file (make run's points at another localstripe).
    os.environ.update(
        DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{DB_NAME}",
        REDIS_URL=f"redis://127.0.0.1:6379/{args.redis_db}", DEBUG="false",
        SECRET_KEY="p4-" + "x" * 50, DJANGO_SETTINGS_MODULE="stateguard_web.settings",
        STATEGUARD_ENV_FILE="", STRIPE_API_KEY=STRIPE_KEY,
        STATEGUARD_SANDBOX_DIR=str(log_dir / "sandbox"))
    if args.lease:
        os.environ.update(zip(("STATEGUARD_LEASE_SECONDS", "STATEGUARD_LEASE_RENEW_SECONDS",
                               "STATEGUARD_SWEEP_SECONDS"), args.lease.split(","), strict=True))

    from bench import databases
    from bench.procs import Worker, start_localstripe, start_moto

    databases.recreate(DB_NAME)
    import django

    django.setup()
    import redis
    import stripe
    from django.conf import settings

    from tests.web.stripe_relay import StripeRelay

    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
    ls_proc, ls_url = start_localstripe(log_dir)
    aws_proc, aws_url = start_moto(log_dir)  # the provision runs' AWS
    relay = StripeRelay(ls_url)
    env = {**os.environ, "STRIPE_API_BASE": relay.url, "AWS_ENDPOINT_URL": aws_url}
    celery = [sys.executable, "-m", "celery", "-A", "stateguard_web"]
    beat = Worker("beat", [*celery, "beat", "-l", "info", "-s", str(log_dir / "beat-schedule")],
                  env, log_dir)
    rescuer = Worker("rescuer", [*celery, "worker", "-l", "info", "-c", "2", "-n",
                                 "p4-rescuer@%h", "--without-mingle", "--without-gossip"],
                     env, log_dir)
    victims = {way: Worker(f"victim-{way}", [
        *celery, "worker", "-l", "info", "-c", "1", "-Q", VICTIM_QUEUE, "-n",
        f"p4-victim-{way}@%h", "--without-mingle", "--without-gossip"],
        {**env, "STATEGUARD_WORKER_LOCK": flag}, log_dir) for way, flag in WAYS.items()}
    client = stripe.StripeClient(STRIPE_KEY, base_addresses={"api": ls_url})
    lease = (settings.STATEGUARD_LEASE_SECONDS, settings.STATEGUARD_LEASE_RENEW_SECONDS,
             settings.STATEGUARD_SWEEP_SECONDS)
    print(f"p4: {args.kills} kills and {args.stalls} stalls of {args.stall_seconds:.0f} s each "
          f"way, lease/renew/sweep {lease} s; logs in {log_dir}", flush=True)
    report: dict[str, Any] = {"lease": lease, "stall_seconds": args.stall_seconds,
                              "kills": [], "stalls": []}
    try:
        beat.start()
        rescuer.start()
        wait(rescuer.ready, 120, "the rescuer to boot")
        for i in range(2 * args.kills):
            way = list(WAYS)[i % 2]
            report["kills"].append(kill(victims[way], way, i))
            print(f"  kill {i + 1:2}/{2 * args.kills} {way:5}: recovery started "
                  f"{report['kills'][-1]['recovery']:5.1f} s after SIGKILL", flush=True)
        for i in range(2 * args.stalls):
            way = list(WAYS)[i % 2]
            report["stalls"].append(stall(victims[way], way, i, relay, client,
                                          args.stall_seconds))
            s = report["stalls"][-1]
            print(f"  stall {i + 1:2}/{2 * args.stalls} {way:5}: {s['takeovers']} takeovers, "
                  f"{s['outcome']}, charges {s['charges']}, refunds {s['refunds']}, fenced "
                  f"{s['fenced']}", flush=True)
    finally:  # also on Ctrl-C: nothing of ours is left running
        for w in [*victims.values(), rescuer, beat]:
            if w.proc is not None and w.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(w.proc.pid, signal.SIGCONT)  # a stopped victim cannot stop
            w.stop()
        relay.close()
        ls_proc.terminate()
        ls_proc.wait(timeout=30)
        aws_proc.kill()
        aws_proc.wait(timeout=30)
    (log_dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
    bad = print_report(report)
    print(f"logs and report.json in {log_dir}")
    sys.exit(1 if bad else 0)


def wait(predicate: Callable[[], object], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise SystemExit(f"p4: timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)
    return value


def submit(agent: str, data: dict[str, Any]) -> Any:
    """A run of ``agent`` queued for the victim alone (the rescuer does not read its queue)."""
    from stateguard_web.runs import runtime, tasks
    from stateguard_web.sagas.models import Run

    schema = runtime.agent_spec(agent).input_schema
    run = Run.objects.create(agent=agent,
                             input=schema.model_validate(data).model_dump(mode="json"))
    tasks.run_execute.apply_async((run.pk,), queue=VICTIM_QUEUE)
    return run


def recoveries(run: Any) -> Any:
    """The run's ``run.recovering`` audit events: one per takeover, written as recovery starts."""
    from stateguard_web.sagas.models import AuditEvent

    return AuditEvent.objects.filter(run=run, action="run.recovering").order_by("pk")


def finished(run: Any) -> bool:
    run.refresh_from_db()
    return run.status in ("succeeded", "compensated", "needs_attention")


def kill(victim: Any, way: str, i: int) -> dict[str, Any]:
    from stateguard_web.runs.runtime import config_for, guard_for

    victim.start()
    wait(victim.ready, 120, f"victim-{way} to boot")
    run = submit("provision", {"name": f"p4-{i}", "sleep_at": "attach_address",
                               "sleep_seconds": 120})
    graph = guard_for("provision")[1]
    # The checkpoint naming attach_address is saved before its body (sync durability) sleeps.
    wait(lambda: graph.get_state(config_for(run.thread_id)).next == ("attach_address",), 60,
         "the victim to go into attach_address")
    killed = time.time()
    victim.kill()
    event = wait(lambda: recoveries(run).first(), 120, "recovery to start")
    wait(lambda: finished(run), 120, "recovery to end the run")
    return {"way": way, "run": str(run.code), "lease_lock": run.lease_lock is not None,
            "handed_over": round(run.requeued_at.timestamp() - killed, 2),
            "recovery": round(event.created_at.timestamp() - killed, 2),
            "outcome": run.status}


def stall(victim: Any, way: str, i: int, relay: Any, client: Any, seconds: float
          ) -> dict[str, Any]:
    relay.released.clear()
    held = relay.hold_answer(HOLD_CHARGE)
    victim.start()
    wait(victim.ready, 120, f"victim-{way} to boot")
    run = submit("checkout", {"email": f"p4-{i}@example.com", "amount": 42_00})
    wait(held.reached.is_set, 60, "Stripe to charge")
    os.killpg(victim.proc.pid, signal.SIGSTOP)
    try:
        relay.release()  # the answer waits in the stopped worker's socket
        time.sleep(seconds)
    finally:
        os.killpg(victim.proc.pid, signal.SIGCONT)
    wait(lambda: finished(run), 120, "the run to end")
    takeovers = recoveries(run).count()
    fenced = False
    if takeovers:  # woken, the victim finds it lost the run: give it the time to say so
        deadline = time.monotonic() + 30
        while not (fenced := "was taken over by another worker" in victim.output()):
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
    victim.stop()
    charges, refunds = stripe_effects(client, str(run.code))
    return {"way": way, "run": str(run.code), "outcome": run.status,
            "takeovers": takeovers, "fenced": fenced,
            "charges": len(charges), "charged": sum(charges.values()),
            "refunds": len(refunds), "refunded": sum(refunds)}


def stripe_effects(client: Any, code: str) -> tuple[dict[str, int], list[int]]:
    """The run's charges (charge id -> amount) and its refunds' amounts, as Stripe holds them."""
    charges: dict[str, int] = {}
    for pi in client.v1.payment_intents.list(params={"limit": 100}).auto_paging_iter():
        metadata = pi.metadata.to_dict() if pi.metadata else {}
        if metadata.get("stateguard_run") == code and pi.status == "succeeded":
            latest = pi.latest_charge
            charges[latest if isinstance(latest, str) else latest.id] = int(pi.amount)
    refunds = [int(r.amount) for ch in charges for r in client.v1.refunds.list(
        params={"charge": ch, "limit": 100}).auto_paging_iter()
        if r.status not in ("failed", "canceled")]
    return charges, refunds


def print_report(report: dict[str, Any]) -> bool:
    bad = False
    print(f"\nlease/renew/sweep {tuple(report['lease'])} s")
    print("SIGKILL -> recovery starts (s):   n  median  p90   max   min   (sweep hands over, "
          "median)")
    for way in WAYS:
        kills = [k for k in report["kills"] if k["way"] == way]
        if not kills:
            continue
        seconds = sorted(k["recovery"] for k in kills)
        over = statistics.median(k["handed_over"] for k in kills)
        p90 = seconds[min(len(seconds) - 1, round(0.9 * (len(seconds) - 1)))]
        print(f"  {way:5}{len(seconds):27} {statistics.median(seconds):7.1f} {p90:5.1f} "
              f"{seconds[-1]:5.1f} {seconds[0]:5.1f}   ({over:.1f})")
        if way == "lock":
            bad |= statistics.median(seconds) > 5 or seconds[-1] > 8
    print(f"SIGSTOP {report['stall_seconds']:.0f} s mid-charge: takeovers, outcomes, "
          "fenced on waking, Stripe")
    for way in WAYS:
        stalls = [s for s in report["stalls"] if s["way"] == way]
        if not stalls:
            continue
        twice = [s["run"] for s in stalls if s["charges"] > 1 or s["refunds"] > 1
                 or s["refunded"] > s["charged"]]
        unrefunded = [s["run"] for s in stalls if s["outcome"] != "succeeded"
                      and s["refunded"] < s["charged"]]
        takeovers = sum(s["takeovers"] for s in stalls)
        outcomes = Counter(s["outcome"] for s in stalls)
        print(f"  {way:5} {len(stalls)} stalls: {takeovers} takeovers, "
              f"{dict(outcomes)}, fenced {sum(s['fenced'] for s in stalls)}; charges "
              f"{sum(s['charges'] for s in stalls)}, refunds {sum(s['refunds'] for s in stalls)}"
              f"; effects twice {len(twice)}, charges of unwound runs not refunded "
              f"{len(unrefunded)}")
        bad |= bool(twice or unrefunded) or (way == "lock" and takeovers > 0)
    return bad


if __name__ == "__main__":
    main()
