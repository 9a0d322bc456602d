"""R1 for the agents whose effects are more than a Stripe charge (issue 21): the stand-ins
``r1_chaos.py --agent provision|travel|cleanup|mix`` starts, the runs it submits, and what it
counts afterwards from each provider's own side (never from the journal). ``mix`` runs the three
in turn on the same workers and stand-ins, each run counted by its agent's rules.

=========== =================================== ===========================================
agent       its world                           counted (each must be 0)
=========== =================================== ===========================================
provision   moto's server (EC2, Route 53)       through boto3, by the ``stateguard:run`` tag:
            behind a relay adding latency       instances not terminated, Elastic IPs,
                                                security groups and DNS records of runs that
                                                did not succeed; two instances or addresses
                                                of one run (``faults_stripe.count_aws``)
travel      localstripe (r1's relay), an SMTP   Stripe as for checkout (r1's ``count``); at
            server keeping what it accepts      the SMTP server's folder, per run: a
            (``tools/smtp_server.py``'s         confirmation accepted twice, two
            handler) that answers ``250``       confirmations, an unwound run whose accepted
            ``--mail-latency`` s after keeping  confirmation has no apology or more than one,
            the message, the hotel sandbox      an apology of a succeeded run or of a
                                                confirmation never accepted; rooms still held
                                                by unwound runs
cleanup     moto's server (S3, a versioned      per run, from S3's versions: an unwound run's
            bucket of one object per run)       object still deleted, or back as another
                                                version or other bytes, or still tagged; a
                                                succeeded run's object not deleted
=========== =================================== ===========================================

Then, for every agent, ``reconcile_effects``' own comparison of the ledger with each provider
the agent uses (``payments.reconcile.ledger_reconcile_all`` on the batch's runs): each drift
line is counted.

Runs set to fail (half, by the seed): ``provision`` fails at a step after its first effect,
``travel`` asks for a trip to Atlantis (no hotel: the charge is refunded), ``cleanup`` fails
after its delete (``verify_gone``). The kills unwind the others they hit (``on_crash`` unwind),
at any point: between the e-mail's ``250`` and the journal, say.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

from agents.mailbox import MailFolder
from bench.fault_relay import FaultRelay, aws_error, failed_answer
from bench.procs import start_moto, stop
from tools.smtp_server import FolderHandler

AGENTS = ("provision", "travel", "cleanup")
MIX = "mix"  # the three at once, in turn, on the same workers and stand-ins
BUCKET = "chaos-files"
UNWOUND = ("compensated", "needs_attention")
MAIL_FROM = "StateGuard <stateguard@chaos.test>"
# One message handed to the server twice (a send sent again after its 250 was lost): the copies
# share their Message-ID, so a mail client shows one (docs/deploy.md, "E-mail").
COPIES = "copies of one e-mail (its Message-ID accepted twice)"
PROVISION_FAILS = ("launch_instance", "attach_address", "create_record")
RECONCILED = {"provision": ("aws",), "travel": ("stripe", "smtp"), "cleanup": ("s3",)}


class SlowFolderHandler(FolderHandler):
    """``make run``'s SMTP handler, answering ``250`` ``delay`` seconds after it kept the
    message: the window where a killed sender leaves its e-mail accepted and unrecorded."""

    def __init__(self, folder: MailFolder, delay: float) -> None:
        super().__init__(folder)
        self.delay = delay

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        reply = await super().handle_DATA(server, session, envelope)
        await asyncio.sleep(self.delay)
        return reply


@dataclass
class World:
    """The stand-ins of one agent's world: what the workers' environment needs to reach them,
    and how to stop them."""

    agent: str
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    aws_url: str = ""  # moto itself, for counting (the workers go through the relay)
    mail: MailFolder | None = None
    relay: FaultRelay | None = None
    originals: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # key -> version
    _stops: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for stop_one in reversed(self._stops):
            with contextlib.suppress(Exception):
                stop_one()


def agents_of(agent: str) -> tuple[str, ...]:
    return AGENTS if agent == MIX else (agent,)


def start(agent: str, log_dir: Path, latency: float) -> World:
    """Start ``agent``'s stand-ins (``checkout``'s localstripe is r1's own): moto behind a
    relay adding ``latency`` seconds a request, or an SMTP server answering ``latency``
    seconds late."""
    world = World(agent, log_dir)
    try:
        if {"provision", "cleanup"} & set(agents_of(agent)):
            proc, world.aws_url = start_moto(log_dir)
            world._stops.append(lambda: stop(proc))
            world.relay = FaultRelay(world.aws_url, lambda _: None, latency=latency,
                                     failed=failed_answer(aws_error(), "text/xml"))
            world._stops.append(world.relay.close)
            world.env.update(AWS_ENDPOINT_URL=world.relay.url, AWS_ACCESS_KEY_ID="testing",
                             AWS_SECRET_ACCESS_KEY="testing", AWS_REGION="us-east-1")
        if "travel" in agents_of(agent):
            world.mail = MailFolder(log_dir / "mail")
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            controller = Controller(SlowFolderHandler(world.mail, latency), hostname="127.0.0.1",
                                    port=port, server_hostname="localhost")
            controller.start()
            world._stops.append(controller.stop)
            world.mail.declare_server("127.0.0.1", port)
            world.env.update(EMAIL_URL=f"smtp://127.0.0.1:{port}",
                             STATEGUARD_MAIL_DIR=str(world.mail.path),
                             DEFAULT_FROM_EMAIL=MAIL_FROM)
    except BaseException:
        world.close()
        raise
    return world


def inputs(agent: str, runs: int, rng: random.Random, world: World
           ) -> list[tuple[str, dict[str, Any]]]:
    """Each run's agent and input; ``mix``: the three agents in turn."""
    each = agents_of(agent)
    made = {a: iter(_inputs(a, len(range(i, runs, len(each))), rng, world))
            for i, a in enumerate(each)}
    return [(each[i % len(each)], next(made[each[i % len(each)]])) for i in range(runs)]


def _inputs(agent: str, runs: int, rng: random.Random, world: World) -> list[dict[str, Any]]:
    """An agent's inputs, half of them (drawn from ``rng``) set to fail after an effect; for
    ``cleanup``, the bucket and its objects are made here, one per run."""
    failing = set(rng.sample(range(runs), runs // 2))
    if agent == "provision":
        return [{"name": f"chaos-{i}"} | ({"fail_at": rng.choice(PROVISION_FAILS)}
                                          if i in failing else {}) for i in range(runs)]
    if agent == "travel":
        return [{"email": f"chaos-{i}@example.com",
                 "destination": "Atlantis" if i in failing else "Lisbon", "nights": 2,
                 "amount": rng.randint(1_00, 100_00)} for i in range(runs)]
    s3 = _s3(world.aws_url)
    s3.create_bucket(Bucket=BUCKET)
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    made = []
    for i in range(runs):
        key, body = f"chaos/{i}.txt", rng.randbytes(64)
        version = s3.put_object(Bucket=BUCKET, Key=key, Body=body)["VersionId"]
        world.originals[key] = (version, body)
        made.append({"bucket": BUCKET, "key": key}
                    | ({"fail_at": "verify_gone"} if i in failing else {}))
    return made


def failing(agent: str, run_input: dict[str, Any]) -> bool:
    """Whether a run's input set it to fail."""
    if agent == "travel":
        return run_input.get("destination") == "Atlantis"
    if agent == "checkout":
        return bool(run_input.get("fail_booking"))
    return "fail_at" in run_input


def _s3(url: str) -> Any:
    from agents.aws import client
    from agents.registry import AwsSettings

    return client(AwsSettings(region="us-east-1", endpoint_url=url, access_key_id="testing",
                              secret_access_key="testing"), "s3")


# -- counting, from the providers' side -----------------------------------------------------
def count(world: World, codes: dict[str, dict[str, Any]], agents: dict[str, str]
          ) -> dict[str, Any]:
    """``problems`` (name -> what each counts) and what else a report says of the world, for
    the runs of each agent (``agents``: run code -> agent)."""
    from stateguard_web.sagas.models import Run

    problems: dict[str, list[str]] = defaultdict(list)
    found: dict[str, Any] = {}
    for agent in agents_of(world.agent):
        mine = {c: i for c, i in codes.items() if agents[c] == agent}
        runs = {str(r.code): r for r in Run.objects.filter(code__in=list(mine))}
        said = f"{agent} " if world.agent == MIX else ""
        if agent == "provision":
            from bench.faults_stripe import count_aws

            aws = count_aws(world.aws_url, mine)
            found[f"{said}aws"] = aws["aws"]
            aws["problems"].pop("runs not finished", None)  # r1's journal counts say it
            for name, lines in aws["problems"].items():
                problems[name] += lines
        elif agent == "travel":
            assert world.mail is not None
            found[f"{said}mail"] = count_mail(world.mail, runs, problems)
            found[f"{said}hotel"] = count_rooms(world.log_dir / "sandbox", runs, problems)
        elif agent == "cleanup":
            found[f"{said}s3"] = count_s3(_s3(world.aws_url), world.originals, mine, runs,
                                          problems)
        found[f"{said}reconcile"] = reconcile(agent, runs, problems)
    return {**found, "problems": dict(problems)}


def count_mail(folder: MailFolder, runs: dict[str, Any],
               problems: dict[str, list[str]]) -> dict[str, int]:
    """Every message the server accepted, per run: confirmations (no ``In-Reply-To``) and
    apologies (in reply to one), each with how often the server accepted it."""
    confirmations: dict[str, Counter[str]] = defaultdict(Counter)  # run -> Message-ID -> n
    # run -> replied-to id -> the apology's Message-ID -> n
    apologies: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
    total = 0
    for stored in folder.messages():
        headers = stored.headers()
        run, message_id = str(headers["X-StateGuard-Run"]), str(headers["Message-ID"]).strip()
        total += 1
        if reply_to := str(headers.get("In-Reply-To", "") or "").strip():
            apologies[run][reply_to][message_id] += 1
        else:
            confirmations[run][message_id] += 1
    for run in set(confirmations) | set(apologies):
        status = runs[run].status if run in runs else "not of this batch"
        sent = confirmations[run]
        if len(sent) > 1:
            problems["double e-mails (two confirmations of one run)"].append(
                f"{run} {dict(sent)}")
        for replied, made in apologies[run].items():
            if replied not in sent:
                problems["apologies of a confirmation never accepted"].append(f"{run} {replied}")
            if len(made) > 1:
                problems["double e-mails (two apologies of one confirmation)"].append(
                    f"{run} {dict(made)}")
        for message_id, n in (*sent.items(),
                              *(i for made in apologies[run].values() for i in made.items())):
            if n > 1:
                problems[COPIES].append(f"{run} {message_id} x {n}")
        if status == "succeeded" and apologies[run]:
            problems["apologies of succeeded runs"].append(run)
        if status in UNWOUND:
            for confirmation in sent:
                if confirmation not in apologies[run]:
                    problems["unwound runs' confirmations without an apology"].append(
                        f"{run} {status} {confirmation}")
        if status not in ("succeeded", *UNWOUND):
            problems["e-mails of runs not of this batch or not finished"].append(
                f"{run} {status}")
    for code, run in runs.items():
        if run.status == "succeeded" and not confirmations.get(code):
            problems["succeeded runs without a confirmation"].append(code)
    return {"messages": total,
            "confirmations": sum(sum(c.values()) for c in confirmations.values()),
            "apologies": sum(sum(made.values()) for a in apologies.values()
                             for made in a.values()),
            "runs unwound after their confirmation": sum(
                1 for code in confirmations if code in runs and runs[code].status in UNWOUND)}


def count_rooms(sandbox: Path, runs: dict[str, Any],
                problems: dict[str, list[str]]) -> dict[str, int]:
    """The hotel rooms held now: a run's is named by the run and its call (the scripted
    model's call id is ``call_reserve_hotel``)."""
    from agents.travel import reservation_of

    held = {p.name for p in (sandbox / "hotel").glob("res_*")}
    for code, run in runs.items():
        room = reservation_of(code, "call_reserve_hotel")
        if run.status in UNWOUND and room in held:
            problems["rooms still held by unwound runs"].append(f"{code} {room}")
        if run.status == "succeeded" and room not in held:
            problems["succeeded runs without a room"].append(code)
    return {"rooms held": len(held)}


def count_s3(s3: Any, originals: dict[str, tuple[str, bytes]], codes: dict[str, dict[str, Any]],
             runs: dict[str, Any], problems: dict[str, list[str]]) -> dict[str, int]:
    """Each run's object, as S3 has it now, against the version it had before the run."""
    from botocore.exceptions import ClientError

    from agents.cleanup import OURS

    deleted = in_place = 0
    for code, run in runs.items():
        key = codes[code]["key"]
        version, body = originals[key]
        try:
            now = s3.get_object(Bucket=BUCKET, Key=key)
            current: tuple[str, bytes] | None = (now["VersionId"], now["Body"].read())
        except ClientError as exc:
            if exc.response["Error"]["Code"] not in ("NoSuchKey", "404"):
                raise
            current = None
        deleted += current is None
        if run.status == "succeeded" and current is not None:
            problems["succeeded deletes whose object is there"].append(f"{code} {key}")
        if run.status not in UNWOUND:
            continue
        if current is None:
            problems["objects left deleted after an unwind"].append(f"{code} {key}")
            continue
        in_place += 1  # restored, or never deleted (the run died before its delete)
        if current != (version, body):
            problems["objects restored as another version or other bytes"].append(
                f"{code} {key} {current[0]} (was {version})")
        tags = s3.get_object_tagging(Bucket=BUCKET, Key=key, VersionId=version)["TagSet"]
        if left := [t["Key"] for t in tags if t["Key"] in OURS]:
            problems["restored objects still tagged"].append(f"{code} {key} {left}")
    return {"objects": len(originals), "deleted now": deleted,
            "unwound runs' objects in place": in_place}


def reconcile(agent: str, runs: dict[str, Any], problems: dict[str, list[str]]
              ) -> dict[str, str]:
    """``reconcile_effects`` on the batch's runs, for the agent's providers: each drift is a
    problem (the ledger and the provider disagree)."""
    from stateguard_web.payments.drift import Scope
    from stateguard_web.payments.reconcile import ledger_reconcile_all

    summary = {}
    outcomes = ledger_reconcile_all(names=RECONCILED[agent],
                                    scope=Scope(runs=tuple(runs.values())))
    for outcome in outcomes:
        if outcome.report is None:
            problems[f"reconcile_effects: {outcome.name} not compared"].append(
                outcome.lines()[0])
            continue
        summary[outcome.name] = outcome.report.summary()
        for drift in outcome.report.unresolved:
            problems[f"reconcile_effects: {outcome.name} drift"].append(str(drift))
    return summary


# What the report lists per agent; each must be 0.
MUST_BE_ZERO = {
    "provision": ("orphan instances", "orphan addresses", "orphan groups", "orphan records",
                  "duplicate instances", "duplicate addresses", "succeeded runs missing a part",
                  "failed runs that succeeded", "resources naming no run of this batch",
                  "ledger: parts misstated", "ledger: parts missing",
                  "reconcile_effects: aws drift", "reconcile_effects: aws not compared"),
    "travel": ("double e-mails (two confirmations of one run)",
               "double e-mails (two apologies of one confirmation)", COPIES,
               "unwound runs' confirmations without an apology",
               "apologies of a confirmation never accepted", "apologies of succeeded runs",
               "succeeded runs without a confirmation",
               "e-mails of runs not of this batch or not finished",
               "rooms still held by unwound runs", "succeeded runs without a room",
               "reconcile_effects: stripe drift", "reconcile_effects: smtp drift",
               "reconcile_effects: stripe not compared", "reconcile_effects: smtp not compared"),
    "cleanup": ("objects left deleted after an unwind",
                "objects restored as another version or other bytes",
                "restored objects still tagged", "succeeded deletes whose object is there",
                "reconcile_effects: s3 drift", "reconcile_effects: s3 not compared"),
}

MUST_BE_ZERO[MIX] = tuple(dict.fromkeys(name for agent in AGENTS for name in MUST_BE_ZERO[agent]))
