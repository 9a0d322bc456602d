"""Issue 22, fault 1 (R2): a provider that fails. Runs go through a relay that fails a share of
every request to the provider, and what must be zero is counted from the provider's side.

    .venv/bin/python bench/faults.py --fault stripe [--runs 100] [--seed 1] [--failures 0.3]
    .venv/bin/python bench/faults.py --fault stripe --agent provision [--runs 40]
    .venv/bin/python bench/faults.py --fault smtp [--runs 60] [--folder hidden|readable]

Everything it uses is its own, started here and stopped at the end: the provider's stand-in
(localstripe for ``checkout``, moto's server for ``provision``) behind a ``FaultRelay``
(``bench/fault_relay.py``), the PostgreSQL database ``stateguard_faults_stripe`` (dropped,
created and migrated), Redis database ``--redis-db`` (4, flushed: not at the same time as
``r1_chaos.py``), one beat (the sweeper, and the wake-up of compensations that wait out an
outage) and ``--workers`` Celery workers of ``--concurrency`` processes, with production's
settings (DEBUG off) but for the waits of a failing compensation, shortened to fit a bench
(``--later INITIAL,CAP,BUDGET``, default 2,10,300 s; production's is 30 s, 1 h, a day).

The relay fails a share ``--failures`` (0.3) of every request, drawn from ``--seed``: half
before the request reaches the provider (``--before``: ``500``, ``timeout``), half after it did
(``--after``: ``cut``, ``late``; the provider acted, the answer is lost). A ``timeout`` or a
``late`` answer is held ``--hang`` seconds, past the workers' Stripe timeout
(``--client-timeout``, given to them as ``STRIPE_TIMEOUT_SECONDS``).

``checkout``: ``--runs`` checkouts at ``--rate`` a second, half of them (by the seed) set to
fail their booking after the charge, so that they unwind. Counted from localstripe's own
objects, as ``r1_chaos.py`` counts them (its ``count``): orphan charges (charged, the run not
succeeded, not refunded in full), double refunds, refunds of succeeded runs, duplicate
charges, runs not finished (a run held ``failed`` for an operator is one: it did not converge),
charges held by runs ``needs_attention`` (once the compensation's wait has had its budget, an
unwound run keeps no charge), and the effect ledger and the journal against Stripe.

``provision``: ``--runs`` servers on moto's AWS (a security group, an instance, an Elastic IP,
a DNS record), a share of them (``--fail-share``, 0.5) set to fail at their last step so that
they unwind. Counted through boto3 from moto's own resources, by their ``stateguard:run`` tag:
orphans (a live instance, address, group or record of a run that did not succeed), duplicates
(two live instances or addresses of one run), succeeded runs missing a part, runs not finished.

``travel`` (``--fault smtp``, ``bench/faults_smtp.py``): ``--runs`` trips on localstripe (no
fault there) whose confirmation goes through an ``SmtpFaultRelay`` in front of ``make run``'s
SMTP server, failing its messages (``--before``: ``451``, ``421``, ``timeout``); half of them
(``--fail-share``) undone by an operator once booked (refund, room, apology). Counted at the
server's folder (``chaos_world.count_mail``), at Stripe (as checkout), the rooms, the trips
unwound by a fault rather than by the operator; ``--folder`` says whether the agents can ask
the folder what the server accepted (``readable``, ``make run``'s) or not (``hidden``, the
default: a real mail server's, where a message sent again after a lost ``250`` is a copy
under the same ``Message-ID``, reported apart, not counted as a failure). Its database is
``stateguard_faults_smtp``.

Exit status 1 when a count that must be 0 is not. Logs and ``report.json`` go to ``--log-dir``
(default: a new folder under /tmp, printed).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from bench import chaos_world, databases
from bench.fault_relay import (
    AFTER,
    BEFORE,
    SMTP_BEFORE,
    FaultRelay,
    SmtpFaultRelay,
    aws_error,
    failed_answer,
    share_of,
)
from bench.procs import Worker, celery_stack, start_localstripe, start_moto, stop
from bench.r1_chaos import DONE, MUST_BE_ZERO, count, log_errors, restart, settle

DB_NAME = "stateguard_faults_stripe"
SMTP_DB_NAME = "stateguard_faults_smtp"  # travel's, so that it runs beside the others
STRIPE_KEY = "sk_test_faults"
HELD = "charges held for an operator (run needs_attention)"
# A booked trip unwound by a fault the agent should have outlived, not by its customer.
UNWOUND_TRIPS = "trips unwound by a fault (not cancelled by an operator)"
# A run held "failed" waits for an operator: it has stopped moving, but has not converged.
SETTLED = (*DONE, "failed")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="faults.py --fault stripe",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--agent", choices=["checkout", "provision", "travel"],
                        default="checkout")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=1.0, help="submissions per second")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=2, help="processes per worker")
    parser.add_argument("--failures", type=float, default=0.3,
                        help="share of the provider's requests that fail")
    parser.add_argument("--before", default=None,
                        help=f"faults before the provider, of {BEFORE} (travel's SMTP server: "
                             f"{SMTP_BEFORE}; '' for none)")
    parser.add_argument("--after", default=",".join(AFTER),
                        help=f"faults after the provider acted, of {AFTER} ('' for none)")
    parser.add_argument("--hang", type=float, default=6.0,
                        help="seconds a timeout or a late answer is held")
    parser.add_argument("--client-timeout", type=float, default=4.0,
                        help="the workers' STRIPE_TIMEOUT_SECONDS (travel: EMAIL_TIMEOUT)")
    parser.add_argument("--retries", type=int, default=None,
                        help="the workers' STRIPE_MAX_NETWORK_RETRIES (default: the settings')")
    parser.add_argument("--latency", type=float, default=0.05,
                        help="seconds the relay adds to each request")
    parser.add_argument("--later", default="2,10,300",
                        help="INITIAL,CAP,BUDGET seconds of a failing compensation's waits")
    parser.add_argument("--fail-share", type=float, default=0.5,
                        help="share of the runs set to fail after their effects")
    parser.add_argument("--deadline", type=float, default=900.0,
                        help="seconds to wait for every run to settle, after the last one")
    parser.add_argument("--folder", choices=["hidden", "readable"], default="hidden",
                        help="travel: whether the agents can ask the SMTP server's folder what "
                             "it accepted (make run's) or not (a real mail server's)")
    parser.add_argument("--redis-db", type=int, default=4)
    parser.add_argument("--log-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    before = SMTP_BEFORE if args.agent == "travel" else BEFORE
    if args.before is None:
        args.before = ",".join(before)
    for side in ("before", "after"):
        names = tuple(n for n in getattr(args, side).split(",") if n)
        allowed = before if side == "before" else AFTER
        if set(names) - set(allowed):
            parser.error(f"--{side}: {sorted(set(names) - set(allowed))} (of {allowed})")
        setattr(args, side, names)
    if not 0 <= args.failures <= 1 or len(args.later.split(",")) != 3:
        parser.error("--failures is a share (0-1); --later is INITIAL,CAP,BUDGET")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # through the cleanup below
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix=f"faults-{args.agent}-s{args.seed}-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    db_name = SMTP_DB_NAME if args.agent == "travel" else DB_NAME
    # Production settings (DEBUG off, no .env file) but for the compensations' waits.
    os.environ.update(
        DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{db_name}",
        REDIS_URL=f"redis://127.0.0.1:6379/{args.redis_db}", DEBUG="false",
        SECRET_KEY="faults-" + "x" * 50, DJANGO_SETTINGS_MODULE="stateguard_web.settings",
        STATEGUARD_ENV_FILE="", STRIPE_API_KEY=STRIPE_KEY,
        STATEGUARD_SANDBOX_DIR=str(log_dir / "sandbox"),
        STRIPE_TIMEOUT_SECONDS=str(args.client_timeout),
        **dict(zip(("STATEGUARD_COMPENSATION_RETRY_LATER_INITIAL",
                    "STATEGUARD_COMPENSATION_RETRY_LATER_CAP",
                    "STATEGUARD_COMPENSATION_RETRY_LATER_BUDGET"), args.later.split(","),
                   strict=True)))
    if args.retries is not None:
        os.environ["STRIPE_MAX_NETWORK_RETRIES"] = str(args.retries)
    rng = random.Random(args.seed)
    choose = share_of(args.failures, random.Random(f"relay-{args.seed}"), args.before,
                      args.after)
    world = None
    if args.agent == "travel":  # first: this process's settings name the mail server
        provider, url = start_localstripe(log_dir)
        world = chaos_world.start("travel", log_dir, 0.0)
        assert world.mail is not None
        smtp = SmtpFaultRelay(world.env["EMAIL_URL"], choose, hang=args.hang)
        relayed = f"smtp://127.0.0.1:{smtp.port}"
        if args.folder == "readable":  # the relay is the server the agents talk to
            world.mail.declare_server("127.0.0.1", smtp.port)
            world.env["EMAIL_URL"] = relayed
        # This process reconciles with the server the folder names; the workers send through
        # the relay.
        os.environ.update(world.env, STRIPE_API_BASE=url,
                          EMAIL_TIMEOUT=str(round(args.client_timeout)))
    databases.recreate(db_name)
    import django

    django.setup()
    import redis
    from django.conf import settings

    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
    if args.agent == "travel":
        relay: FaultRelay = smtp
        env = {**os.environ, "EMAIL_URL": relayed}
    elif args.agent == "checkout":
        provider, url = start_localstripe(log_dir)
        relay = FaultRelay(url, choose, latency=args.latency, hang=args.hang)
        env = {**os.environ, "STRIPE_API_BASE": relay.url}
    else:
        provider, url = start_moto(log_dir)
        relay = FaultRelay(url, choose, latency=args.latency, hang=args.hang,
                           failed=failed_answer(aws_error(), "text/xml"))
        env = {**os.environ, "AWS_ENDPOINT_URL": relay.url, "AWS_ACCESS_KEY_ID": "testing",
               "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}
    beat, workers = celery_stack(env, log_dir, args.workers, args.concurrency, "faults")
    print(f"faults: {args.runs} {args.agent} runs, seed {args.seed}, {args.workers} "
          f"workers x {args.concurrency}; {args.failures:.0%} of the provider's requests fail "
          f"(before: {'/'.join(args.before) or '-'}, after: {'/'.join(args.after) or '-'}; "
          f"hang {args.hang:.0f} s, client timeout {args.client_timeout:.0f} s); "
          f"logs in {log_dir}", flush=True)
    try:
        report = load(args, rng, beat, workers)
        for w in [*workers, beat]:  # nothing moves while the provider is counted
            w.stop()
        report["relay"] = dict(sorted(relay.counts.items()))
        codes = report.pop("codes")
        if args.agent == "checkout":
            import stripe

            client = stripe.StripeClient(STRIPE_KEY, base_addresses={"api": url})
            report.update(count(client, codes, [], relay.counts))
            # localstripe keeps no idempotency keys: a customer whose answer was lost and that
            # the SDK sent again is made twice there (Stripe would answer the key once).
            report["stripe"]["customers"] = sum(
                1 for _ in client.v1.customers.list(params={"limit": 100}).auto_paging_iter())
        elif world is not None:  # travel: Stripe as for checkout, then the mailbox and rooms
            import stripe

            from stateguard_web.sagas.models import Run

            client = stripe.StripeClient(STRIPE_KEY, base_addresses={"api": url})
            agents = dict.fromkeys(codes, "travel")
            report.update(count(client, codes, [], relay.counts, agents))
            found = chaos_world.count(world, codes, agents)
            problems = found.pop("problems")
            if args.folder == "hidden":  # the reconciler's word for the copies: the rule's
                drift = problems.pop("reconcile_effects: smtp drift", [])
                problems["reconcile_effects: smtp drift"] = [
                    line for line in drift if " times by the server" not in line]
            problems[UNWOUND_TRIPS] = sorted(
                f"{code} {status}" for code, status in Run.objects.filter(
                    code__in=list(codes)).exclude(status="succeeded").values_list(
                        "code", "status") if str(code) not in report["undone by an operator"])
            report["problems"].update(problems)
            report.update(world=found, folder=args.folder)
        else:
            report.update(count_aws(url, codes))
        report.update(held_runs(report))
        report["retries"] = journal_retries(list(codes))
        report["log errors"] = log_errors(log_dir)
    finally:  # also on Ctrl-C: nothing of ours is left running
        for w in [*workers, beat]:
            w.stop()
        relay.close()
        if world is not None:
            world.close()
        stop(provider)
    (log_dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
    bad = print_report(report)
    print(f"logs and report.json in {log_dir}")
    return 1 if bad else 0


def load(args: argparse.Namespace, rng: random.Random, beat: Worker, workers: list[Worker]
         ) -> dict[str, Any]:
    """Start beat and the workers, submit the runs and wait for them to settle."""
    from stateguard_web.runs import services

    failing = set(rng.sample(range(args.runs), round(args.runs * args.fail_share)))
    if args.agent == "checkout":
        inputs = [{"email": f"faults-{i}@example.com", "amount": rng.randint(1_00, 100_00),
                   "fail_booking": i in failing} for i in range(args.runs)]
    elif args.agent == "travel":  # the failing ones are undone once booked (undo_booked)
        inputs = [{"email": f"faults-{i}@example.com", "destination": "Lisbon", "nights": 2,
                   "amount": rng.randint(1_00, 100_00)} for i in range(args.runs)]
    else:
        inputs = [{"name": f"srv-{i}", **({"fail_at": "create_record"} if i in failing else {})}
                  for i in range(args.runs)]
    codes: dict[str, dict[str, Any]] = {}  # run code -> its input
    beat.start()
    for w in workers:
        w.start()
    while not all(w.ready() for w in workers):
        time.sleep(0.2)
    start = time.monotonic()
    while len(codes) < args.runs:
        if start + len(codes) / args.rate <= time.monotonic():
            run = services.run_submit(agent=args.agent, input=inputs[len(codes)])
            codes[str(run.code)] = inputs[len(codes)]
        restart(workers, time.monotonic())
        time.sleep(0.02)
    submitted = time.monotonic() - start
    print(f"submitted {len(codes)} runs in {submitted:.0f} s; waiting for every run to settle "
          f"(at most {args.deadline:.0f} s)", flush=True)
    undone: set[str] = set()
    if args.agent == "travel":
        undone = undo_booked([c for i, c in enumerate(codes) if i in failing], workers,
                             args.deadline)
    settle(list(codes), workers, start, args.deadline, SETTLED)
    return {"agent": args.agent, "seed": args.seed, "runs": args.runs,
            "failures": args.failures, "before": args.before, "after": args.after,
            "hang": args.hang, "client_timeout": args.client_timeout, "later": args.later,
            "retries": args.retries, "workers": args.workers, "concurrency": args.concurrency,
            "submit_seconds": round(submitted), "undone by an operator": sorted(undone),
            "total_seconds": round(time.monotonic() - start),
            "starts": {w.name: w.starts for w in workers},
            "exits not ours": {w.name: w.exits for w in [*workers, beat] if w.exits},
            "codes": codes}


def undo_booked(codes: list[str], workers: list[Worker], deadline: float) -> set[str]:
    """An operator's undo of each run of ``codes`` once it succeeded (the customer cancelled
    the trip: refund, the room given back, the apology in reply to the confirmation); the runs
    undone. A run that unwound by itself (its confirmation's attempts spent) is left as it is."""
    from stateguard_web.runs import services
    from stateguard_web.sagas.models import Run

    left, until, undone = set(codes), time.monotonic() + deadline, set()
    while left and time.monotonic() < until:
        for run in Run.objects.filter(code__in=left, status__in=SETTLED):
            left.discard(str(run.code))
            if run.status == "succeeded":
                services.run_compensate(run=run, by="faults", reason="the customer cancelled")
                undone.add(str(run.code))
        restart(workers, time.monotonic())
        time.sleep(0.5)
    return undone


def journal_retries(codes: list[str]) -> dict[str, Any]:
    """What absorbed the failures: the steps run again (by node: how many, the most attempts
    one took) and the compensations tried again (how many, the most attempts, and how many
    waited out their attempts and were woken by the sweeper)."""
    from django.db.models import Count

    from stateguard_web.sagas.models import Compensation, Step

    steps: dict[str, list[int]] = defaultdict(list)
    for node, attempt in Step.objects.filter(run__code__in=codes, attempt__gt=1).values_list(
            "node", "attempt"):
        steps[node].append(attempt)
    tried = list(Compensation.objects.filter(run__code__in=codes).annotate(
        n=Count("attempts")).filter(n__gt=1).values_list("n", flat=True))
    # More attempts than a round's (5): it waited, durably, and the sweeper woke it.
    waited = sum(1 for n in tried if n > 5)
    return {"steps run again": {node: f"{len(a)} (at most {max(a)} attempts)"
                                for node, a in sorted(steps.items())},
            "compensations tried again": f"{len(tried)} (at most {max(tried, default=1)} "
                                         f"attempts; {waited} waited for a later round)"}


def held_runs(report: dict[str, Any]) -> dict[str, Any]:
    """The runs held ``failed`` for an operator, by their error: they stopped, unconverged."""
    from stateguard_web.sagas.models import Run

    codes = [line.split()[0] for line in report["problems"].get("runs not finished", [])]
    held = Counter(f"{(r.error or {}).get('type', '?')}: {str((r.error or {}).get('message'))[:70]}"
                   for r in Run.objects.filter(code__in=codes, status="failed"))
    return {"held failed": dict(held.most_common())}


def count_aws(url: str, codes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What moto holds, by the runs' tags, against what the journal says of the runs: each
    server part alive at AWS must be a succeeded run's, and the ledger must say of each part
    what AWS does (``applied`` while it lives, ``compensated`` once it is gone)."""
    from agents.aws import RUN_TAG, tag_of
    from agents.registry import AwsSettings
    from stateguard_web.sagas.models import Effect, Run
    from tests.aws_world import AwsWorld

    world = AwsWorld(AwsSettings(region="us-east-1", endpoint_url=url, access_key_id="testing",
                                 secret_access_key="testing"))
    runs = {str(r.code): r for r in Run.objects.filter(code__in=list(codes))}
    of_name = {inp["name"]: code for code, inp in codes.items()}
    alive: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for kind, things, key in (("instance", world._instances(alive=True), "InstanceId"),
                              ("elastic_ip", world._addresses(), "AllocationId"),
                              ("security_group", world._groups(), "GroupId")):
        for thing in things:
            alive[str(tag_of(thing, RUN_TAG))][kind].append(str(thing[key]))
    for fqdn in world.records():  # srv-N.stateguard.test.: the ledger's id names its run
        code = of_name.get(fqdn.split(".")[0], "?")
        alive[code]["dns_record"].append(f"{fqdn} A {code}")
    problems: dict[str, list[str]] = defaultdict(list)
    for owner, parts in alive.items():
        if owner not in runs:
            problems["resources naming no run of this batch"].append(f"{owner} {dict(parts)}")
            continue
        if runs[owner].status != "succeeded":
            for kind, ids in parts.items():
                problems[f"orphan {PLURAL[kind]}"].append(f"{owner} {runs[owner].status} {ids}")
        for kind in ("instance", "elastic_ip"):
            if len(parts.get(kind, [])) > 1:
                problems[f"duplicate {PLURAL[kind]}"].append(f"{owner} {parts[kind]}")
    for code, run in runs.items():
        if run.status not in DONE:
            problems["runs not finished"].append(f"{code} {run.status}")
        if run.status == "succeeded":
            if missing := set(PLURAL) - set(alive.get(code, {})):
                problems["succeeded runs missing a part"].append(f"{code} {sorted(missing)}")
            if "fail_at" in codes[code]:
                problems["failed runs that succeeded"].append(code)
    ledger = {(str(code), kind, ext): status for code, kind, ext, status in Effect.objects.filter(
        run__code__in=list(codes), kind__in=list(PLURAL)).values_list(
            "run__code", "kind", "external_id", "status")}
    for (code, kind, ext), status in ledger.items():
        lives = ext in alive.get(code, {}).get(kind, [])
        if lives != (status == "applied"):
            problems["ledger: parts misstated"].append(
                f"{code} {kind} {ext} {status}, AWS {'alive' if lives else 'gone'}")
    for code, parts in alive.items():
        for kind, ids in parts.items():
            for ext in ids:
                if (code, kind, ext) not in ledger:
                    problems["ledger: parts missing"].append(f"{code} {kind} {ext}")
    launched = len(world._instances(alive=False))
    outcomes = Counter(f"{'fail_at' if 'fail_at' in codes[c] else 'ok'} -> {r.status}"
                       for c, r in runs.items())
    return {"outcomes": dict(sorted(outcomes.items())),
            "aws": {"instances launched": launched,
                    "alive": {kind: sum(len(p.get(kind, [])) for p in alive.values())
                              for kind in PLURAL}},
            "problems": {k: sorted(v) for k, v in problems.items()}}


PLURAL = {"instance": "instances", "elastic_ip": "addresses", "security_group": "groups",
          "dns_record": "records"}
AWS_MUST_BE_ZERO = ("orphan instances", "orphan addresses", "orphan groups", "orphan records",
                    "duplicate instances", "duplicate addresses", "runs not finished",
                    "succeeded runs missing a part", "failed runs that succeeded",
                    "resources naming no run of this batch", "ledger: parts misstated",
                    "ledger: parts missing")


def relay_summary(counts: dict[str, int]) -> tuple[int, Counter[str], list[str]]:
    """Requests, faults by name, and a line per kind of write (its requests and faults)."""
    faults: Counter[str] = Counter()
    per_kind: dict[str, Counter[str]] = defaultdict(Counter)
    total = 0
    for key, n in counts.items():
        kind, _, fault = key.rpartition(" ")
        if fault in (*BEFORE, *SMTP_BEFORE, *AFTER):
            faults[fault] += n
            per_kind[kind][fault] += n
        else:
            total += n
            per_kind[key]["requests"] += n
    lines = [f"{kind}: " + ", ".join(f"{k} {v}" for k, v in c.most_common())
             for kind, c in sorted(per_kind.items()) if not kind.startswith("GET")]
    return total, faults, lines


def print_report(report: dict[str, Any]) -> bool:
    print(f"\n{report['runs']} {report['agent']} runs, seed {report['seed']}, "
          f"{report['failures']:.0%} of the provider's requests failed; "
          f"{report['total_seconds']} s in all")
    bad = bool(report["exits not ours"])
    if bad:
        print(f"WORKERS EXITED BY THEMSELVES {report['exits not ours']}: see their logs")
    print("outcomes: " + ", ".join(f"{k} {v}" for k, v in report["outcomes"].items())
          + (f"; {len(report['undone by an operator'])} undone by an operator once booked"
             if report["agent"] == "travel" else ""))
    total, faults, lines = relay_summary(report["relay"])
    print(f"relay: {total} requests, {sum(faults.values())} failed "
          f"({', '.join(f'{k} {v}' for k, v in faults.most_common())})"
          + "".join(f"\n  {line}" for line in lines))
    names: tuple[str, ...]
    if "world" in report:  # travel
        print("stripe: " + ", ".join(f"{k} {v}" for k, v in report["stripe"].items()))
        print("mail: " + ", ".join(f"{k} {v}" for k, v in report["world"]["mail"].items())
              + f" (the agents' folder {report['folder']})")
        names = (*MUST_BE_ZERO, HELD, UNWOUND_TRIPS, *chaos_world.MUST_BE_ZERO["travel"])
        if report["folder"] == "hidden":  # the rule then: at least once, as the same message
            names = tuple(n for n in names if n != chaos_world.COPIES)
            print(f"{chaos_world.COPIES}, the rule where the server cannot be asked: "
                  f"{len(report['problems'].get(chaos_world.COPIES, []))}")
    elif "stripe" in report:
        print("stripe: " + ", ".join(f"{k} {v}" for k, v in report["stripe"].items()))
        names = (*MUST_BE_ZERO, HELD)
    else:
        print(f"aws: {report['aws']}")
        names = AWS_MUST_BE_ZERO
    problems = report["problems"]
    print("counts from the provider, then the ledger and the journal against it (target 0):")
    for name in names:
        found = problems.get(name, [])
        bad = bad or bool(found)
        print(f"  {name:55} {len(found)}" + "".join(f"\n      {x}" for x in found[:10]))
    print("retries: " + "; ".join(f"{k}: {v}" for k, v in report["retries"].items()))
    for what in ("held failed", "needs_attention"):
        found = report.get(what) or {}
        print(f"{what}: {sum(found.values())}" + "".join(f"\n  {n} x {why}"
                                                          for why, n in found.items()))
    print(f"error lines in the logs: {sum(report['log errors'].values())}" + "".join(
        f"\n  {n} x {line}" for line, n in report["log errors"].items()))
    return bad
