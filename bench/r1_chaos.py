"""R1/R2 (issue 10): checkouts on Celery workers SIGKILLed at random, counted from Stripe's side;
and the same for the agents whose effects are servers, e-mails and files (issue 21).

    .venv/bin/python bench/r1_chaos.py [--runs 200] [--seed 1]                         # R1
    .venv/bin/python bench/r1_chaos.py --refund-failures 0.3 [--refund-failure-mode lost]  # R2
    .venv/bin/python bench/r1_chaos.py --agent provision|travel|cleanup|mix --runs 60

With ``--agent`` other than ``checkout``, it also starts that agent's stand-ins (moto's server
behind a relay adding ``--world-latency`` to each AWS call, or an SMTP server answering that
late) and counts, after the runs, from those providers' side: ``bench/chaos_world.py`` says
what (leaked instances, addresses, groups and records by their run's tag; e-mails per run at
the SMTP server's folder; objects left deleted; and ``reconcile_effects``' drift). ``mix``
submits the three in turn, on the same workers and stand-ins.

Everything it uses is its own, started here and stopped at the end: localstripe (in memory,
``tools/localstripe_server.py``) behind a relay, the PostgreSQL database ``stateguard_chaos``
(dropped, created and migrated), Redis database 4 (flushed), one beat (the lease sweeper, as in
production: a process of its own, never killed) and ``--workers`` Celery workers of
``--concurrency`` processes each, with the deployment's lease settings (the defaults, 10 s lease
renewed every 3 s, a sweep every 2 s, unless ``--lease``) and the agent's own crash policy
(``unwind``, unless ``--on-crash resume``).

It submits ``--runs`` checkouts at ``--rate`` a second (half of them, chosen by the seed, with
``fail_booking``; amounts under the approval threshold), and every ``--kill-every`` seconds
SIGKILLs a worker chosen at random, its whole process group (the host died: the pool children
too, and the messages they held stay unacknowledged), restarting it ``--restart-after`` later;
from the first submission until ``--chaos`` seconds after the last. With ``--child-kills P``
that share of the kills hits one pool process instead (as an OOM kill would: Celery's parent
lives on, starts another and re-queues the task). Then it waits for every run
to end (``--deadline``), stops the workers, and counts from localstripe's own objects (never
from the journal): orphan charges (charged, the run not succeeded, not refunded in full),
double refunds (more refunded than charged, or more than one refund of a charge), refunds of
succeeded runs, duplicate charges of a run, and runs not finished; and from the journal, the
runs left ``needs_attention`` and why (their compensations' errors), and whether the effect
ledger agrees with Stripe. Exit status 1 when a count that must be 0 is not.

The relay forwards every request, except that with ``--refund-failures P`` it fails that share of
``POST /v1/refunds`` (drawn from the seed): ``--refund-failure-mode 500`` answers 500 without
forwarding (Stripe did nothing), ``lost`` forwards it and drops the answer (Stripe refunded, the
worker hears a broken connection). The seed fixes the runs, the kill times and victims and the
relay's draws; which run a kill or a failure hits depends on timing.

Logs (every worker's, beat's, localstripe's) and ``report.json`` go to ``--log-dir``
(default: a new folder under /tmp, printed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "stateguard_chaos"
DB_URL = f"postgres://postgres@127.0.0.1:5432/{DB_NAME}"
REDIS_URL = "redis://127.0.0.1:6379/4"
STRIPE_KEY = "sk_test_chaos"
# Production settings: DEBUG off; no .env file (make run's points at another localstripe).
os.environ.update(DATABASE_URL=DB_URL, REDIS_URL=REDIS_URL, DEBUG="false",
                  SECRET_KEY="chaos-" + "x" * 50, DJANGO_SETTINGS_MODULE="stateguard_web.settings",
                  STATEGUARD_ENV_FILE="", STRIPE_API_KEY=STRIPE_KEY)
sys.path.insert(0, str(ROOT))

from bench import chaos_world, databases  # noqa: E402
from bench.fault_relay import FaultRelay, share_of  # noqa: E402
from bench.procs import Worker, start_localstripe, stop  # noqa: E402

DONE = ("succeeded", "compensated", "needs_attention")


class ChaosRelay(FaultRelay):
    """Forwards every request to localstripe, ``latency`` seconds later (half on the way there,
    half on the way back: Stripe's own answers take a few hundred ms, localstripe's a few, and
    the windows a kill can hit are these); fails a share ``rate`` of ``POST /v1/refunds``, drawn
    from ``rng``: answered 500 unforwarded (``mode="500"``), or forwarded with the answer
    dropped (``mode="lost"``)."""

    def __init__(self, target: str, rate: float, mode: str, rng: random.Random,
                 latency: float) -> None:
        fault = {"500": "500", "lost": "cut"}[mode]
        choose = share_of(rate, rng, (fault,), (), only=lambda kind: kind == "POST /v1/refunds")
        super().__init__(target, choose, latency=latency)


@dataclass
class Kill:
    at: float  # seconds since the first submission
    worker: str
    runs: list[str] = field(default_factory=list)  # codes of the runs its processes held


def parse_range(text: str) -> tuple[float, float]:
    low, _, high = text.partition(",")
    return float(low), float(high or low)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--agent", choices=["checkout", *chaos_world.AGENTS, chaos_world.MIX],
                        default="checkout",
                        help="the agent whose runs it submits (mix: the other three in turn)")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=1.0, help="submissions per second")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=2, help="processes per worker")
    parser.add_argument("--kill-every", default="2,6",
                        help="seconds between kills: MIN,MAX (of a worker that has booted)")
    parser.add_argument("--restart-after", default="0.5,3", help="seconds down: MIN,MAX")
    parser.add_argument("--child-kills", type=float, default=0.0,
                        help="share of kills that hit one pool process, not the whole worker")
    parser.add_argument("--stripe-latency", type=float, default=0.2,
                        help="seconds the relay adds to each Stripe call")
    parser.add_argument("--world-latency", type=float, default=0.2,
                        help="seconds moto's relay adds to each AWS call, or the SMTP server "
                             "waits before its 250 (provision, cleanup, travel)")
    parser.add_argument("--chaos", type=float, default=30.0,
                        help="seconds of kills after the last submission")
    parser.add_argument("--deadline", type=float, default=600.0,
                        help="seconds to wait for every run to end, after the kills")
    parser.add_argument("--refund-failures", type=float, default=0.0,
                        help="share of POST /v1/refunds that fail (R2: 0.3)")
    parser.add_argument("--refund-failure-mode", choices=["500", "lost"], default="500")
    parser.add_argument("--lease", default="",
                        help="LEASE,RENEW,SWEEP seconds (default: the settings' 10,3,2)")
    parser.add_argument("--on-crash", choices=["unwind", "resume"], default="",
                        help="checkout's crash policy (default: the agent's own, unwind)")
    parser.add_argument("--log-dir", type=Path, default=None)
    args = parser.parse_args()
    # Ctrl-C, or SIGTERM (also when started in the background, where SIGINT is ignored), ends
    # the script through its cleanup.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminated)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix=f"chaos-s{args.seed}-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    relay_rng = random.Random(f"relay-{args.seed}")

    env_extra: dict[str, str] = {}
    if args.lease:
        env_extra.update(zip(("STATEGUARD_LEASE_SECONDS", "STATEGUARD_LEASE_RENEW_SECONDS",
                              "STATEGUARD_SWEEP_SECONDS"), args.lease.split(","), strict=True))
    if args.on_crash:
        env_extra["STATEGUARD_ON_CRASH"] = ",".join(
            f"{a}={args.on_crash}" for a in chaos_world.agents_of(args.agent))
    # The providers first: this process submits the runs and counts with the workers'
    # settings (the travel agent wants its mail server to build).
    ls_proc, ls_url = start_localstripe(log_dir)
    relay = ChaosRelay(ls_url, args.refund_failures, args.refund_failure_mode, relay_rng,
                       args.stripe_latency)
    world = chaos_world.start(args.agent, log_dir, args.world_latency)
    env_extra.update(world.env, STRIPE_API_BASE=relay.url,
                     STATEGUARD_SANDBOX_DIR=str(log_dir / "sandbox"))
    os.environ.update(env_extra)

    databases.recreate(DB_NAME)
    import django

    django.setup()
    import redis
    import stripe
    from django.conf import settings

    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
    env = dict(os.environ)
    beat = Worker("beat", [sys.executable, "-m", "celery", "-A", "stateguard_web", "beat",
                           "-l", "info", "-s", str(log_dir / "beat-schedule")], env, log_dir)
    workers = [Worker(f"w{i + 1}", [
        sys.executable, "-m", "celery", "-A", "stateguard_web", "worker", "-l", "info",
        "-c", str(args.concurrency), "-n", f"chaos-w{i + 1}@%h", "--without-mingle",
        "--without-gossip"], env, log_dir) for i in range(args.workers)]
    try:
        report = chaos(args, rng, beat, workers, world)
        for w in [*workers, beat]:  # nothing moves while the providers are counted
            w.stop()
        codes, agents = report.pop("codes"), report.pop("agents")
        report.update(count(stripe.StripeClient(STRIPE_KEY, base_addresses={"api": ls_url}),
                            codes, report["kill log"], relay.counts, agents))
        if args.agent != "checkout":
            world_found = chaos_world.count(world, codes, agents)
            report["problems"].update(world_found.pop("problems"))
            report["world"] = world_found
        report["log errors"] = log_errors(log_dir)
    finally:  # also on Ctrl-C: nothing of ours is left running
        for w in [*workers, beat]:
            w.stop()
        relay.close()
        world.close()
        stop(ls_proc)
    (log_dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
    bad = print_report(report)
    print(f"logs and report.json in {log_dir}")
    sys.exit(1 if bad else 0)


def _terminated(*_: Any) -> None:
    print("chaos: SIGTERM from outside; stopping what it started", file=sys.stderr, flush=True)
    sys.exit(143)


def chaos(args: argparse.Namespace, rng: random.Random, beat: Worker, workers: list[Worker],
          world: chaos_world.World) -> dict[str, Any]:
    """Start beat and the workers, submit the runs under kills and wait for them to end."""
    from django.conf import settings

    from stateguard_web.runs import services
    from stateguard_web.sagas.models import Run

    kill_every, restart_after = parse_range(args.kill_every), parse_range(args.restart_after)
    lease = (settings.STATEGUARD_LEASE_SECONDS, settings.STATEGUARD_LEASE_RENEW_SECONDS,
             settings.STATEGUARD_SWEEP_SECONDS)
    print(f"chaos: {args.runs} {args.agent} runs, seed {args.seed}, {args.workers} workers x "
          f"{args.concurrency}, lease/renew/sweep {lease} s, kill every {kill_every} s, "
          f"Stripe +{args.stripe_latency:.2f} s a call, refund failures "
          f"{args.refund_failures:.0%} ({args.refund_failure_mode}); "
          f"logs in {beat.log_dir}", flush=True)

    if args.agent == "checkout":
        failing = set(rng.sample(range(args.runs), args.runs // 2))
        inputs = [("checkout", {"email": f"chaos-{i}@example.com",
                                "amount": rng.randint(1_00, 100_00), "fail_booking": i in failing})
                  for i in range(args.runs)]
    else:
        inputs = chaos_world.inputs(args.agent, args.runs, rng, world)
    codes: dict[str, dict[str, Any]] = {}  # run code -> its input
    agents: dict[str, str] = {}  # run code -> its agent
    kills: list[Kill] = []
    beat.start()
    for w in workers:
        w.start()
    time.sleep(5)  # let them boot before the first kill can come
    start = time.monotonic()
    next_kill = start + rng.uniform(*kill_every)
    chaos_end: float | None = None
    while True:
        now = time.monotonic()
        while len(codes) < args.runs and start + len(codes) / args.rate <= now:
            agent, run_input = inputs[len(codes)]
            run = services.run_submit(agent=agent, input=run_input)
            codes[str(run.code)], agents[str(run.code)] = run_input, agent
        if chaos_end is None and len(codes) == args.runs:
            chaos_end = now + args.chaos
        restart(workers, now)
        if chaos_end is not None and now >= chaos_end:
            break
        if now >= next_kill and (up := [w for w in workers
                                        if w.restart_at is None and w.ready()]):
            victim = rng.choice(up)
            pids = victim.pids()
            children = sorted(pids - {victim.proc.pid} if victim.proc else ())
            if children and rng.random() < args.child_kills:
                # One pool process (an OOM kill): Celery's parent lives, starts another and
                # re-queues the task (reject_on_worker_lost).
                pids = {rng.choice(children)}
                with contextlib.suppress(ProcessLookupError):
                    os.kill(next(iter(pids)), signal.SIGKILL)
                name = f"{victim.name}/child"
            else:
                victim.kill()
                victim.restart_at = now + rng.uniform(*restart_after)
                name = victim.name
            held = [str(c) for c, owner in Run.objects.exclude(lease_owner="")
                    .values_list("code", "lease_owner") if int(owner.split(":")[1]) in pids]
            kills.append(Kill(round(now - start, 1), name, held))
            print(f"  {now - start:6.1f} s: SIGKILL {name} ({len(held)} runs held)", flush=True)
            next_kill = now + rng.uniform(*kill_every)
        time.sleep(0.05)
    for w in workers:
        if w.restart_at is not None:
            w.start()
    chaos_took = time.monotonic() - start
    print(f"submitted {len(codes)} runs, {len(kills)} kills in {chaos_took:.0f} s; waiting "
          f"for every run to end (at most {args.deadline:.0f} s)", flush=True)
    settle(list(codes), workers, start, args.deadline)
    return {"agent": args.agent, "seed": args.seed, "runs": args.runs, "workers": args.workers,
            "concurrency": args.concurrency, "lease": lease,
            "on_crash": args.on_crash or "unwind", "refund_failures": args.refund_failures,
            "mode": args.refund_failure_mode, "stripe_latency": args.stripe_latency,
            "rate": args.rate, "chaos_seconds": round(chaos_took),
            "total_seconds": round(time.monotonic() - start),
            "starts": {w.name: w.starts for w in workers},
            "exits not ours": {w.name: w.exits for w in [*workers, beat] if w.exits},
            "codes": codes, "agents": agents, "kill log": kills}


def settle(codes: list[str], workers: list[Worker], start: float, deadline: float,
           settled: tuple[str, ...] = DONE) -> None:
    """Wait until every run of ``codes`` is in one of the ``settled`` statuses, at most
    ``deadline`` seconds, restarting the workers that exit meanwhile; say every 15 s how many
    are not, and where they are (``start``: when the first was submitted)."""
    from stateguard_web.sagas.models import Run

    left = Run.objects.filter(code__in=codes).exclude(status__in=settled)
    until, last_print = time.monotonic() + deadline, 0.0
    while left.exists() and time.monotonic() < until:
        restart(workers, time.monotonic())
        if time.monotonic() - last_print > 15:
            where = Counter(left.values_list("status", flat=True))
            print(f"  {time.monotonic() - start:6.0f} s: {sum(where.values())} runs not "
                  f"{'/'.join(settled)} {dict(where)}", flush=True)
            last_print = time.monotonic()
        time.sleep(1)


def restart(workers: list[Worker], now: float) -> None:
    """Start the workers due to restart, and any that exited by itself (counted: a worker that
    cannot start makes the run worthless)."""
    for w in workers:
        if w.restart_at is None and w.proc is not None and w.proc.poll() is not None:
            w.exits += 1
            print(f"  {w.name} exited by itself ({w.proc.returncode}); see its log", flush=True)
            w.restart_at = now
        if w.restart_at is not None and now >= w.restart_at:
            w.start()


def log_errors(log_dir: Path) -> dict[str, int]:
    """The workers' and beat's ERROR and CRITICAL lines, alike ones counted together."""
    found: Counter[str] = Counter()
    for log in log_dir.glob("*.log"):
        if log.name == "localstripe.log":
            continue
        for line in log.read_text(errors="replace").splitlines():
            if " ERROR" in line or " CRITICAL" in line:
                text = re.sub(r"^\[?[\d-]+ [\d:,]+\]?:? ?", "", line)
                found[re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}|\d+", "N", text)[:160]] += 1
    return dict(found.most_common(20))


# The step that charges, per agent that charges (travel's tool calls are steps named by tool).
CHARGE_NODE = {"checkout": "charge_user", "travel": "charge_card"}


def count(client: Any, codes: dict[str, dict[str, Any]], kills: list[Kill],
          relay: Counter[str], agents: dict[str, str] | None = None) -> dict[str, Any]:
    """What Stripe holds, per run, against what the journal says of the run (the Stripe
    counts for the agents that charge only); ``agents``: each run's (default checkout)."""
    agent_of = (agents or {}).get
    several = len(set((agents or {}).values())) > 1

    def planned(code: str) -> str:
        agent = agent_of(code, "checkout")
        said = f"{agent} " if several else ""
        return f"{said}{'set to fail' if chaos_world.failing(agent, codes[code]) else 'ok'}"

    from stateguard_web.sagas.models import AuditEvent, Compensation, Effect, Run

    intents = list(client.v1.payment_intents.list(params={"limit": 100}).auto_paging_iter())
    refunds = list(client.v1.refunds.list(params={"limit": 100}).auto_paging_iter())
    runs = {str(r.code): r for r in Run.objects.filter(code__in=list(codes))}
    recovered = Counter(str(c) for c in AuditEvent.objects.filter(
        run__code__in=list(codes), action="run.recovering").values_list("run__code", flat=True))
    charges: dict[str, Any] = {}  # charge id -> charge
    charge_run: dict[str, str] = {}  # charge id -> run code
    intent_of: dict[str, str] = {}  # charge id -> PaymentIntent id
    by_run: dict[str, list[str]] = defaultdict(list)  # run code -> its charges
    stray: list[str] = []
    for pi in intents:
        code = (pi.metadata.to_dict() if pi.metadata else {}).get("stateguard_run")
        if pi.status != "succeeded":
            continue
        ch = pi.latest_charge
        charges[ch.id], intent_of[ch.id] = ch, pi.id
        if code not in runs:
            stray.append(pi.id)
            continue
        charge_run[ch.id] = code
        by_run[code].append(ch.id)
    refunds_of: dict[str, list[Any]] = defaultdict(list)
    for r in refunds:
        if r.status not in ("failed", "canceled"):
            refunds_of[r.charge].append(r)

    problems: dict[str, list[str]] = defaultdict(list)  # count name -> what it counts
    for ch_id, code in charge_run.items():
        ch, run = charges[ch_id], runs[code]
        made = refunds_of.get(ch_id, [])
        refunded = sum(r.amount for r in made)
        if run.status != "succeeded" and refunded < ch.amount:
            key = ("charges held for an operator (run needs_attention)"
                   if run.status == "needs_attention" else "orphan charges")
            problems[key].append(f"{code} {ch_id} {ch.amount} refunded {refunded}")
        if refunded > ch.amount or len(made) > 1 or ch.amount_refunded > ch.amount:
            problems["double refunds"].append(
                f"{code} {ch_id} {ch.amount} refunded {refunded} in {len(made)}")
        if run.status == "succeeded" and made:
            problems["refunds of succeeded runs"].append(f"{code} {ch_id} {refunded}")
    for code, ids in by_run.items():
        if len(ids) > 1:
            problems["duplicate charges"].append(f"{code} {len(ids)} charges")
    for code, run in runs.items():
        if run.status not in DONE:
            problems["runs not finished"].append(f"{code} {run.status}")
        agent = agent_of(code, "checkout")
        if run.status == "succeeded" and not by_run.get(code) and agent in CHARGE_NODE:
            problems["succeeded runs without a charge"].append(code)
        if run.status == "succeeded" and chaos_world.failing(agent, codes[code]):
            problems["failed bookings that succeeded"].append(code)
    if stray:
        problems["charges naming no run of this batch"] = stray
    known = set(charges)
    for r in refunds:
        if r.charge not in known:
            problems["refunds of unknown charges"].append(r.id)

    # The journal: why runs need attention, and whether the ledger says what Stripe says.
    attention: Counter[str] = Counter()
    for code, run in runs.items():
        if run.status != "needs_attention":
            continue
        why, injected = [], True
        for comp in Compensation.objects.filter(run=run).exclude(
                status__in=["succeeded", "nothing_to_undo"]).prefetch_related("attempts"):
            last = max(comp.attempts.all(), key=lambda a: a.number, default=None)
            error = (last.error or {}) if last else {}
            injected = injected and "injected by the chaos relay" in str(error.get("message"))
            why.append(f"{comp.node} {comp.status} after {comp.attempts.count()} attempts: "
                       f"{error.get('type', '?')}: {str(error.get('message', ''))[:80]}")
        # Expected only when every compensation left failed was failed by the relay.
        label = "injected refund failures" if why and injected else "NOT the relay's"
        crashed = ", recovered after a crash" if code in recovered else ""
        attention[f"[{label}{crashed}] " + ("; ".join(why) or "no failed compensation")] += 1
    ledger = {(e.kind, e.external_id): e for e in Effect.objects.filter(
        run__code__in=list(codes), provider="stripe")}
    for ch_id, code in charge_run.items():
        pi_id = intent_of[ch_id]
        effect = ledger.get(("charge", pi_id))
        refunded = sum(r.amount for r in refunds_of.get(ch_id, []))
        want = ("applied" if not refunded else "compensated" if refunded >= charges[ch_id].amount
                else "partially_compensated")
        if effect is None:
            problems["ledger: charges missing"].append(f"{code} {pi_id}")
        elif effect.status != want or effect.amount != charges[ch_id].amount:
            problems["ledger: charges misstated"].append(
                f"{code} {pi_id} {effect.status}/{effect.amount}, Stripe {want}")
        for r in refunds_of.get(ch_id, []):
            if ("refund", r.id) not in ledger:
                problems["ledger: refunds missing"].append(f"{code} {r.id}")
    stripe_ids = {pi.id for pi in intents} | {r.id for r in refunds}
    for kind, ext in ledger:
        if ext not in stripe_ids:
            problems["ledger: effects Stripe does not have"].append(f"{kind} {ext}")

    # The journal agrees with itself: a finished run has no compensation still running, an
    # unwound run compensated its charge step (done, failed or cut off: the refund looks for
    # the charge), a compensated run undid everything, a succeeded run undid nothing.
    from stateguard_web.sagas.models import Step

    comps_of: dict[str, list[Any]] = defaultdict(list)
    for comp in Compensation.objects.filter(run__code__in=list(codes)).select_related("run",
                                                                                      "step"):
        comps_of[str(comp.run.code)].append(comp)
    for code, run in runs.items():
        if run.status not in DONE:
            continue
        statuses = {c.status for c in comps_of[code]}
        if "running" in statuses:
            problems["journal: compensations left running"].append(code)
        if run.status == "compensated" and statuses - {"succeeded", "nothing_to_undo"}:
            problems["journal: compensated runs with an undone compensation"].append(code)
        if run.status == "succeeded" and statuses:
            problems["journal: succeeded runs with a compensation"].append(code)
    for step in Step.objects.filter(run__code__in=list(codes),
                                    node__in=CHARGE_NODE.values()).select_related("run"):
        code = str(step.run.code)
        if step.node != CHARGE_NODE.get(agent_of(code, "checkout")):
            continue
        if runs[code].status in ("compensated", "needs_attention") and not any(
                c.step_id == step.pk for c in comps_of[code]):
            problems["journal: charge steps of unwound runs not compensated"].append(
                f"{code} {step.status}")
    finished = sorted((r.finished_at - r.created_at).total_seconds() for r in runs.values()
                      if r.finished_at)

    # What recovery did with each run it took over: its outcome, and what each compensation's
    # attempts said ("refunded", "found": an earlier attempt's refund, False: nothing to undo).
    after_crash: Counter[str] = Counter()
    for code in recovered:
        comps = [f"{c.node} {c.status} [" + ", ".join(
            str(a.result).split(" ")[0].strip("'\"") if a.ok else (a.error or {}).get("type", "?")
            for a in sorted(c.attempts.all(), key=lambda a: a.number)) + "]"
            for c in Compensation.objects.filter(run=runs[code]).prefetch_related("attempts")]
        after_crash[f"{planned(code)} -> "
                    f"{runs[code].status}: {'; '.join(comps) or 'no compensation'}"] += 1
    outcomes = Counter(f"{planned(c)} -> {r.status}" for c, r in runs.items())
    return {
        "outcomes": dict(sorted(outcomes.items())),
        "stripe": {"payment intents": len(intents), "charges": len(charges),
                   "refunds": len(refunds), "refunded in full": sum(
                       1 for ch in charges.values() if ch.amount_refunded >= ch.amount)},
        "relay": dict(sorted(relay.items())),
        "kills": len(kills), "kills that hit a run": sum(1 for k in kills if k.runs),
        "runs held by a killed process": len({c for k in kills for c in k.runs}),
        "runs recovered": len(recovered), "recoveries": sum(recovered.values()),
        "recovered runs": dict(sorted(after_crash.items())),
        "seconds from submission to the end, p50 p95 max": [
            round(finished[int(q * (len(finished) - 1))], 1) for q in (0.5, 0.95, 1.0)
        ] if finished else [],
        "problems": {k: sorted(v) for k, v in problems.items()},
        "needs_attention": dict(attention),
        "kill log": [(k.at, k.worker, k.runs) for k in kills],
    }


# Counts that must be 0 (R1 and R2); "charges held for an operator" are runs left
# needs_attention with their charge, which R2's failing refunds may leave.
MUST_BE_ZERO = ("orphan charges", "double refunds", "refunds of succeeded runs",
                "duplicate charges", "runs not finished", "succeeded runs without a charge",
                "failed bookings that succeeded", "charges naming no run of this batch",
                "refunds of unknown charges", "ledger: charges missing",
                "ledger: charges misstated", "ledger: refunds missing",
                "ledger: effects Stripe does not have", "journal: compensations left running",
                "journal: compensated runs with an undone compensation",
                "journal: succeeded runs with a compensation",
                "journal: charge steps of unwound runs not compensated")


def print_report(report: dict[str, Any]) -> bool:
    print(f"\n{report['runs']} {report['agent']} runs, seed {report['seed']}, refund failures "
          f"{report['refund_failures']:.0%} ({report['mode']}), on_crash {report['on_crash']}: "
          f"{report['chaos_seconds']} s of chaos, {report['total_seconds']} s in all")
    if report["exits not ours"]:
        print(f"WORKERS EXITED BY THEMSELVES {report['exits not ours']}: this run tells "
              "nothing until that is fixed (see their logs)")
    print(f"kills: {report['kills']} ({report['kills that hit a run']} hit a run; "
          f"{report['runs held by a killed process']} runs held by a killed process), "
          f"worker starts {report['starts']}; runs recovered by the sweeper: "
          f"{report['runs recovered']} ({report['recoveries']} recoveries)")
    print("outcomes: " + ", ".join(f"{k} {v}" for k, v in report["outcomes"].items()))
    print("recovered runs:" + "".join(f"\n  {n} x {what}"
                                      for what, n in report["recovered runs"].items()))
    print("stripe: " + ", ".join(f"{k} {v}" for k, v in report["stripe"].items()))
    print("relay: " + ", ".join(f"{k} {v}" for k, v in report["relay"].items()))
    problems = report["problems"]
    bad = bool(report["exits not ours"])
    print("seconds from submission to the end, p50 p95 max: "
          f"{report['seconds from submission to the end, p50 p95 max']}")
    world = report.get("world", {})
    for what, figures in world.items():
        print(f"{what}: {figures}")
    print("counts from Stripe, then the ledger and the journal against it (target 0):")
    held_name = "charges held for an operator (run needs_attention)"
    names = [*MUST_BE_ZERO, *chaos_world.MUST_BE_ZERO.get(report["agent"], ())]
    if report["agent"] != "checkout":
        print(f"  (the last {len(chaos_world.MUST_BE_ZERO[report['agent']])} from "
              f"{report['agent']}'s providers: bench/chaos_world.py)")
    names += sorted(set(problems) - set(names) - {held_name})  # a count no list names
    for name in names:
        found = problems.get(name, [])
        bad = bad or bool(found)
        print(f"  {name:55} {len(found)}" + "".join(f"\n      {x}" for x in found[:10]))
    held = problems.get(held_name, [])
    print(f"  {'charges held for an operator':55} {len(held)}  (runs needs_attention)")
    print(f"error lines in the logs: {sum(report['log errors'].values())}" + "".join(
        f"\n  {n} x {line}" for line, n in report["log errors"].items()))
    attention = report["needs_attention"]
    print(f"needs_attention: {sum(attention.values())}")
    for why, n in attention.items():
        print(f"  {n} x {why}")
        bad = bad or "NOT the relay's" in why
    return bad


if __name__ == "__main__":
    main()
