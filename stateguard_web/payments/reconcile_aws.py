"""Reconciliation with AWS (``drift.Reconciler``): the servers' parts the ledger records
(providers ``ec2`` and ``route53``: security groups, instances, Elastic IPs, DNS records, and
their removals) against what AWS holds, through boto3 with this deployment's ``AWS_*`` settings,
the agents' own (``runs.runtime.aws_settings``, ``agents.aws.client``).

Looked at, at AWS: every security group, instance and Elastic IP tagged ``stateguard:run``
(``DescribeSecurityGroups``, ``DescribeInstances``, ``DescribeAddresses`` filtered by the tag,
or by the runs' ids; terminated instances too, which AWS lists for about an hour), and every
DNS record with an owner TXT record beside it (``"stateguard:run=<run>"``) in the account's
hosted zones (``ListHostedZones``, ``ListResourceRecordSets``). In the ledger: each part in
scope, read at AWS by its id (``group-id``, ``instance-id``, ``allocation-id`` filters) when no
listing found it.

Drift, one line each:

* a part at AWS tagged with a run, not in the ledger (the ledger gap: ``AllocateAddress``
  answered and the worker died before ``record_effect``): ``fix`` records it, for a run the
  journal has, under the step its ``ClientToken`` or ``stateguard:token`` tag names; an instance
  found terminated, with its termination;
* an instance terminated at AWS, not undone in the ledger: ``fix`` records its termination;
* a part in the ledger that AWS does not have (removed outside the ledger, or by an undo whose
  record was lost), a part compensated in the ledger that AWS still has (a leak), a part tagged
  with another run than the ledger's, a removal whose part the ledger lacks: reported only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import boto3
from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings

from agents.aws import NAME_TAG, RUN_TAG, TOKEN_TAG, client, error_code, tag_of
from agents.provision import owner_of, record_id
from stateguard.effects import Effect as CoreEffect
from stateguard_web.payments.drift import ReconcileError, Report, Scope, record_found, run_of
from stateguard_web.runs import runtime
from stateguard_web.sagas.models import Effect

__all__ = ["AwsReconciler", "OnAws", "aws_error", "aws_unconfigured"]

ALIVE = ("pending", "running", "stopping", "stopped")
MAX_VALUES = 200  # values in one EC2 filter


@dataclass(frozen=True, slots=True)
class Part:
    """A kind of part as the ledger records it, and how its removal is recorded."""

    provider: str
    kind: str
    what: str
    undo_kind: str
    undone: str  # the removal's id is "<id> <undone>"


PARTS = {p.kind: p for p in (
    Part("ec2", "security_group", "security group", "deletion", "deleted"),
    Part("ec2", "instance", "instance", "termination", "terminated"),
    Part("ec2", "elastic_ip", "Elastic IP", "release", "released"),
    Part("route53", "dns_record", "DNS record", "deletion", "deleted"),
)}
PROVIDERS = ("ec2", "route53")


@dataclass(frozen=True, slots=True)
class Found:
    """A part as AWS shows it now."""

    part: Part
    external_id: str  # the ledger's id of it
    run: str  # its stateguard:run tag ("" if none)
    key: str  # the key of the step that made it (ClientToken, stateguard:token), or ""
    name: str
    state: Literal["present", "ended"]  # ended: an instance shutting down or terminated
    made_at: datetime | None = None

    def __str__(self) -> str:
        return f"{self.part.what} {self.external_id}" + (f" ({self.name})" if self.name else "")


def aws_unconfigured() -> str | None:
    """Why this deployment cannot reach AWS, or ``None``: it names a local stand-in or keys,
    or boto3's own chain (an instance role, ``~/.aws``) finds credentials."""
    if settings.AWS_ENDPOINT_URL or settings.AWS_ACCESS_KEY_ID:
        return None
    if boto3.session.Session(region_name=settings.AWS_REGION).get_credentials() is None:
        return ("no AWS credentials: AWS_ACCESS_KEY_ID is not set and boto3's chain (an "
                "instance role, ~/.aws) finds none")
    return None


def aws_error(exc: Exception) -> ReconcileError:
    """AWS's own words for what failed (botocore's are long)."""
    if isinstance(exc, ClientError):
        said = exc.response.get("Error", {}).get("Message") or error_code(exc)
        return ReconcileError(f"AWS answered {error_code(exc)}: {said}")
    return ReconcileError(f"AWS could not be reached at "
                          f"{settings.AWS_ENDPOINT_URL or 'its endpoints'}: {exc}")


class OnAws(ABC):
    """A reconciler whose provider is reached with the deployment's AWS settings (EC2 and
    Route 53 here, S3 in ``reconcile_s3``): configured alike, failing alike. Each subclass
    says what it compares (``compare``)."""

    name: str
    title: str

    def unconfigured(self) -> str | None:
        return aws_unconfigured()

    def reconcile(self, scope: Scope) -> Report:
        try:
            return self.compare(scope)
        except (ClientError, BotoCoreError) as exc:
            raise aws_error(exc) from exc

    @abstractmethod
    def compare(self, scope: Scope) -> Report:
        """The ledger against this provider, raising boto's errors as they come."""


class AwsReconciler(OnAws):
    name, title = "aws", "AWS"

    def compare(self, scope: Scope) -> Report:
        return _Pass(scope).run()


class _Pass:
    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        aws = runtime.aws_settings()
        self.ec2, self.route53 = client(aws, "ec2"), client(aws, "route53")
        self.report = Report("AWS", "resource")
        self._records: list[Found] | None = None

    def run(self) -> Report:
        found = {f.external_id: f for f in self.listed() if f.run and self.scope.covers(
            f.run, f.made_at)}
        ledger = list(self.scope.ledger(PROVIDERS))
        made = [e for e in ledger if e.kind in PARTS and not e.undoes]
        missing = [e for e in made if e.external_id not in found]
        found.update({f.external_id: f for f in self.by_id(missing)})
        known = {e.external_id: e for e in Effect.objects.filter(
            provider__in=PROVIDERS, external_id__in=list(found)).select_related("run")}
        compared = {e.external_id for e in made} | set(found)
        self.report.compared = len(compared)
        for effect in made:
            self.compare(effect, found.get(effect.external_id))
        for thing in found.values():
            if thing.external_id not in known and thing.run:
                self.unrecorded(thing)
        self.orphan_removals(ledger)
        return self.report

    # -- what AWS holds -------------------------------------------------------------------
    def listed(self) -> Iterator[Found]:
        """Every part tagged with a run (the scope's runs, when it names them)."""
        codes = sorted(self.scope.run_codes) if self.scope.run_codes is not None else None
        if codes == []:
            return
        for filters in _tag_filters(codes):
            yield from self.groups(filters)
            yield from self.instances(filters)
            yield from self.addresses(filters)
        yield from (r for r in self.records() if codes is None or r.run in codes)

    def by_id(self, effects: list[Effect]) -> Iterator[Found]:
        """The ledger's parts no listing found, read by their ids (an untagged one, say)."""
        ids: dict[str, list[str]] = {}
        for e in effects:
            ids.setdefault(e.kind, []).append(e.external_id)
        for kind, name, read in (("security_group", "group-id", self.groups),
                                 ("instance", "instance-id", self.instances),
                                 ("elastic_ip", "allocation-id", self.addresses)):
            for chunk in _chunks(ids.get(kind, [])):
                yield from read([{"Name": name, "Values": chunk}])
        if ids.get("dns_record"):
            wanted = set(ids["dns_record"])
            yield from (r for r in self.records() if r.external_id in wanted)

    def groups(self, filters: list[dict[str, Any]]) -> Iterator[Found]:
        pages = self.ec2.get_paginator("describe_security_groups").paginate(Filters=filters)
        for group in (g for page in pages for g in page["SecurityGroups"]):
            yield _found("security_group", group["GroupId"], group, "present")

    def instances(self, filters: list[dict[str, Any]]) -> Iterator[Found]:
        pages = self.ec2.get_paginator("describe_instances").paginate(Filters=filters)
        for i in (i for page in pages for r in page["Reservations"] for i in r["Instances"]):
            state = "present" if i["State"]["Name"] in ALIVE else "ended"
            yield _found("instance", i["InstanceId"], i, state, key=i.get("ClientToken", ""),
                         made_at=i.get("LaunchTime"))

    def addresses(self, filters: list[dict[str, Any]]) -> Iterator[Found]:
        for address in self.ec2.describe_addresses(Filters=filters)["Addresses"]:
            yield _found("elastic_ip", address["AllocationId"], address, "present")

    def records(self) -> list[Found]:
        """Each DNS record with an owner TXT record beside it, in every hosted zone (read
        once per pass)."""
        if self._records is None:
            self._records = list(self._read_records())
        return self._records

    def _read_records(self) -> Iterator[Found]:
        zones = self.route53.get_paginator("list_hosted_zones").paginate()
        for zone in (z for page in zones for z in page["HostedZones"]):
            pages = self.route53.get_paginator("list_resource_record_sets").paginate(
                HostedZoneId=zone["Id"])
            for s in (s for page in pages for s in page["ResourceRecordSets"]):
                runs = [owner_of(r["Value"]) for r in s.get("ResourceRecords", [])
                        if s["Type"] == "TXT"]
                for run in filter(None, runs):
                    yield Found(PARTS["dns_record"], record_id(s["Name"], run), run, "",
                                s["Name"], "present")

    # -- drift ----------------------------------------------------------------------------
    def compare(self, effect: Effect, found: Found | None) -> None:
        """A part of the ledger against what AWS shows of it."""
        part, run = PARTS[effect.kind], str(effect.run.code)
        undone = effect.status == Effect.Status.COMPENSATED
        if found is None:
            if not undone:
                self.report.add(effect.external_id, run, f"{effect.status} in the ledger; AWS "
                                f"has no such {part.what} (removed outside the ledger, or by "
                                "an undo whose record was lost)")
            return
        if found.run and found.run != run:
            self.report.add(effect.external_id, run, f"tagged with run {found.run} at AWS, "
                                                     "recorded for this run in the ledger")
        if found.state == "present" and undone:
            self.report.add(effect.external_id, run, f"compensated in the ledger; {found} is "
                                                     "still at AWS")
        elif found.state == "ended" and not undone:
            what = f"terminated at AWS, {effect.status} in the ledger"
            if self.scope.fix:
                self.removal(effect.run, found, step=(effect.step_id, effect.node))
            self.report.add(effect.external_id, run, what + (": recorded" if self.scope.fix
                                                             else ""), fixed=self.scope.fix)

    def unrecorded(self, found: Found) -> None:
        """A part at AWS tagged with a run, which the ledger lacks."""
        what = (f"{found} tagged with run {found.run} was launched and terminated at AWS, "
                "neither in the ledger" if found.state == "ended" else
                f"{found} tagged with run {found.run} is at AWS, not in the ledger")
        run = run_of(found.run)
        if run is None:
            self.report.add(found.external_id, found.run,
                            f"{what}; its run is not in the journal, so it is not recorded")
        elif not self.scope.fix:
            self.report.add(found.external_id, found.run, what)
        else:
            record_found(run=run, key=found.key, by=self.scope.by, effect=CoreEffect(
                found.part.provider, found.part.kind, found.external_id,
                idempotency_key=found.key))
            if found.state == "ended":
                self.removal(run, found)
            self.report.add(found.external_id, found.run, f"{what}: recorded", fixed=True)

    def removal(self, run: Any, found: Found, step: tuple[str, str] | None = None) -> None:
        """Record the removal of ``found``, under the step that made it."""
        part = found.part
        record_found(run=run, key=found.key, step=step, by=self.scope.by, effect=CoreEffect(
            part.provider, part.undo_kind, f"{found.external_id} {part.undone}",
            undoes=found.external_id))

    def orphan_removals(self, ledger: Iterable[Effect]) -> None:
        """Removals in scope whose part the ledger does not hold (recorded before the
        compensations recorded what they found, or by another agent)."""
        removals = [e for e in ledger if e.undoes]
        held = set(Effect.objects.filter(provider__in=PROVIDERS, external_id__in=[
            e.undoes for e in removals]).values_list("provider", "external_id"))
        for e in removals:
            if (e.provider, e.undoes) not in held:
                self.report.add(e.undoes, str(e.run.code), f"the ledger records its {e.kind} "
                                f"({e.external_id}), not the {e.provider} part itself")


def _found(kind: str, external_id: str, resource: dict[str, Any], state: Any, *, key: str = "",
           made_at: datetime | None = None) -> Found:
    return Found(PARTS[kind], str(external_id), tag_of(resource, RUN_TAG) or "",
                 key or tag_of(resource, TOKEN_TAG) or "", tag_of(resource, NAME_TAG) or "",
                 state, made_at)


def _tag_filters(codes: list[str] | None) -> Iterator[list[dict[str, Any]]]:
    if codes is None:
        yield [{"Name": "tag-key", "Values": [RUN_TAG]}]
        return
    for chunk in _chunks(codes):
        yield [{"Name": f"tag:{RUN_TAG}", "Values": chunk}]


def _chunks(values: list[str]) -> Iterator[list[str]]:
    for i in range(0, len(values), MAX_VALUES):
        yield values[i:i + MAX_VALUES]
