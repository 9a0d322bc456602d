"""The "provision" agent: a server on AWS, through boto3 (moto's local server under ``make run``
and the tests, AWS itself where a deployment says so: docs/deploy.md).

Four steps, each with its compensation, undone newest first:

================== ================================================ ========================
step               effect                                           compensation
================== ================================================ ========================
create_group       a security group ``stateguard-<name>``           delete the group
launch_instance    an EC2 instance (``RunInstances``, ``ClientToken`` terminate the instance
                   = the step's idempotency key) in that group
attach_address     an Elastic IP, allocated and associated          release the address
create_record      ``<name>.<zone>`` A → the address in Route 53    delete the record
                   (the zone is made once, by the first run)
================== ================================================ ========================

**Ownership is explicit.** Every resource carries its run's id from the request that makes it
(EC2 tags ``stateguard:run`` / ``stateguard:name`` / ``stateguard:token``, ``agents/aws.py``;
the DNS record a TXT record beside it, ``"stateguard:run=<run>"``, changed in the same batch),
and a compensation removes only what carries its own run's id. A name belongs to one run at a
time: the group's name is unique in its VPC, so a second run for ``web-1`` fails at its first
step, before any effect (``NameTaken``: "web-1 is provisioned by run ..."), and a group or a
record of that name that no run owns (made by hand) is never adopted (``NotOwned``). Once the
owner's run is compensated, the name is free again.

**A step whose result was lost** (its worker died after the effect, before the journal saved
the step) is in doubt. Every compensation is ``in_doubt_safe``: it looks its resources up by
its run's tag, not in the step's result, and removes what it finds (nothing, if the step died
before its effect). A step that runs again finds what its earlier run made by the step's token
(the instance and the address) or by the group's and the record's names with its run's tag,
and makes nothing twice. Each effect and each removal goes into the effect ledger
(``record_effect``), where the dashboard shows it; a compensation records each part it found
before it removes it, so a part whose step died before recording it is in the ledger too (and
an instance an earlier attempt terminated, whose termination it did not record, is found
terminated and recorded so). ``manage.py reconcile_effects --provider aws`` compares the
ledger with what AWS holds by the same tags.

``fail_at`` and ``sleep_at``/``sleep_seconds`` simulate a failing or slow step (before its
effect; with ``sleep_after_effect`` the step sleeps after it instead: a slow answer, for the
crash tests); with ``hold_failure`` the simulated failure holds the run ``failed`` for an
operator (retry it, retry it from an earlier step with ``fail_at`` cleared, or compensate it)
instead of unwinding it.

Options (``STATEGUARD_AGENT_OPTIONS={"provision": {...}}``): ``zone``, the DNS zone the records
go in (default ``stateguard.test``), and ``image_id``, the AMI to launch (default: one of
moto's; with AWS itself, none: its runs fail before any effect until one is named).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from functools import cached_property
from typing import Any, Literal, TypedDict

from botocore.exceptions import ClientError
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from pydantic import Field

from agents.aws import (
    AWS_STEP_RETRY,
    RUN_TAG,
    TOKEN_TAG,
    aws_settings,
    client,
    error_code,
    tag_filters,
    tag_of,
    tags,
)
from agents.registry import AgentInput, AgentSettings, AgentSpec, AwsSettings, register, run_id
from stateguard import (
    Compensation,
    ConfigurationError,
    Effect,
    EffectStatus,
    ExceptionContext,
    Retriable,
    effect_key,
    record_effect,
    step_effects,
)

NODES = ("create_group", "launch_instance", "attach_address", "create_record")
Node = Literal["create_group", "launch_instance", "attach_address", "create_record"]
INSTANCE_TYPES = Literal["t3.nano", "t3.micro", "t3.small", "t3.medium"]
LOCAL_IMAGE = "ami-12c6146b"  # one of the images moto's server knows
ALIVE = ["pending", "running", "stopping", "stopped"]  # an instance not (being) terminated
ENDING = ["shutting-down", "terminated"]
# Real AWS takes a minute to start or end an instance; moto's server answers at once.
WAIT = {"Delay": 5, "MaxAttempts": 60}


class ProvisionInput(AgentInput):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,39}$")
    instance_type: INSTANCE_TYPES = "t3.micro"
    fail_at: Node | None = None
    hold_failure: bool = False
    sleep_at: Node | None = None
    sleep_seconds: float = Field(default=0.0, ge=0, le=120)
    sleep_after_effect: bool = False


class ProvisionState(TypedDict, total=False):
    name: str
    instance_type: str
    fail_at: str | None
    hold_failure: bool
    sleep_at: str | None
    sleep_seconds: float
    sleep_after_effect: bool
    group_id: str
    instance_id: str
    allocation_id: str
    address: str
    record: dict[str, str]  # {"name": "web-1.stateguard.test.", "value": "<address>"}


class ProvisioningFailed(Exception):
    pass


class SimulatedFailure(ProvisioningFailed):
    """``fail_at``'s failure; ``hold``: the run's input asked to hold it for an operator."""

    def __init__(self, message: str, *, hold: bool) -> None:
        super().__init__(message)
        self.hold = hold


class NameTaken(ProvisioningFailed):
    """Another run provisioned the name and still holds it."""


class NotOwned(ProvisioningFailed):
    """A resource of the name exists that no run owns (made by hand)."""


def provision_error_policy(exc: BaseException) -> Literal["compensate", "hold"]:
    """Unwind on any failure, but hold a simulated one the input asked to hold."""
    return "hold" if isinstance(exc, SimulatedFailure) and exc.hold else "compensate"


def _before(state: dict[str, Any], node: str) -> None:
    if state.get("sleep_at") == node and not state.get("sleep_after_effect"):
        time.sleep(float(state.get("sleep_seconds") or 0))
    if state.get("fail_at") == node:
        raise SimulatedFailure(f"{node} failed for {state['name']!r}",
                               hold=bool(state.get("hold_failure")))


def _after(state: dict[str, Any], node: str) -> None:
    if state.get("sleep_at") == node and state.get("sleep_after_effect"):
        time.sleep(float(state.get("sleep_seconds") or 0))


def group_name(name: str) -> str:
    return f"stateguard-{name}"


def owner_text(run: str) -> str:
    """The value of the TXT record that says which run owns the A record beside it."""
    return f'"stateguard:run={run}"'  # a TXT record's value is quoted


def owner_of(text: str) -> str | None:
    """The run an owner TXT record's value names (``None``: not such a record)."""
    match = re.fullmatch(r'"stateguard:run=([^"]+)"', text)
    return match[1] if match else None


def record_id(fqdn: str, run: str) -> str:
    """The ledger's id of a run's DNS record: the name alone is another run's later on."""
    return f"{fqdn} A {run}"


class Provisioner:
    """The agent's nodes and compensations, on one AWS account and region."""

    def __init__(self, aws: AwsSettings, *, image_id: str | None, zone: str) -> None:
        self.aws, self.image_id, self.zone = aws, image_id, zone

    @cached_property
    def ec2(self) -> Any:
        return client(self.aws, "ec2")

    @cached_property
    def route53(self) -> Any:
        return client(self.aws, "route53")

    # -- nodes: (state, config), to read the run's id ------------------------------------
    def create_group(self, state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        _before(state, "create_group")
        name, run = state["name"], run_id(config)
        if self.image_id is None:  # before any effect: a run could not launch its instance
            raise ProvisioningFailed(
                "this deployment talks to AWS itself and names no AMI to launch: set "
                'STATEGUARD_AGENT_OPTIONS={"provision": {"image_id": "ami-..."}} (one of '
                "your region's)")
        try:
            group_id = self.ec2.create_security_group(
                GroupName=group_name(name), Description=f"StateGuard server {name}",
                TagSpecifications=tags("security-group", run=run, name=name, token=effect_key(),
                                       Name=name),
            )["GroupId"]
        except ClientError as exc:
            if error_code(exc) != "InvalidGroup.Duplicate":
                raise
            group_id = self._own_group(name, run)  # made by this step's earlier run, or not ours
        record_effect(Effect("ec2", "security_group", group_id, idempotency_key=effect_key()))
        _after(state, "create_group")
        return {"group_id": group_id}

    def _own_group(self, name: str, run: str) -> str:
        groups = self.ec2.describe_security_groups(
            Filters=[{"Name": "group-name", "Values": [group_name(name)]}])["SecurityGroups"]
        if not groups:  # deleted since: a compensation of its owner ran meanwhile
            raise NameTaken(f"{name} is being removed by another run; submit again")
        group_id, owner = groups[0]["GroupId"], tag_of(groups[0], RUN_TAG)
        if owner == run:
            return str(group_id)
        if owner:
            raise NameTaken(f"{name} is provisioned by run {owner}: compensate that run to "
                            "remove it, or choose another name")
        raise NotOwned(f"a security group {group_name(name)} ({group_id}) exists that no run "
                       "owns: it was made by hand; remove it or choose another name")

    def launch_instance(self, state: dict[str, Any], config: RunnableConfig
                        ) -> dict[str, Any]:
        _before(state, "launch_instance")
        name, run, token = state["name"], run_id(config), effect_key()
        # The token tag finds the instance this very step launched before its result was
        # lost; ClientToken makes AWS itself return it for a repeated request (moto does not).
        found = self._instances(tag_filters(token=token))
        instance = found[0] if found else self.ec2.run_instances(
            ImageId=self.image_id, InstanceType=state.get("instance_type") or "t3.micro",
            MinCount=1, MaxCount=1, ClientToken=token, SecurityGroupIds=[state["group_id"]],
            TagSpecifications=tags("instance", run=run, name=name, token=token, Name=name),
        )["Instances"][0]
        instance_id = str(instance["InstanceId"])
        record_effect(Effect("ec2", "instance", instance_id, idempotency_key=token))
        if instance["State"]["Name"] not in ALIVE:
            raise ProvisioningFailed(f"the instance {instance_id} this step launched is "
                                     f"{instance['State']['Name']}: an operator must look")
        # An address is associated with a running instance only.
        self.ec2.get_waiter("instance_running").wait(InstanceIds=[instance_id],
                                                     WaiterConfig=WAIT)
        _after(state, "launch_instance")
        return {"instance_id": instance_id}

    def _instances(self, filters: list[dict[str, Any]], states: list[str] = ALIVE
                   ) -> list[dict[str, Any]]:
        pages = self.ec2.get_paginator("describe_instances").paginate(Filters=[
            *filters, {"Name": "instance-state-name", "Values": states}])
        return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]

    def attach_address(self, state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        _before(state, "attach_address")
        name, run, token = state["name"], run_id(config), effect_key()
        # AllocateAddress takes no idempotency token: the tag is how a second run of this
        # step finds the address its first run allocated.
        found = self.ec2.describe_addresses(Filters=tag_filters(token=token))["Addresses"]
        address = found[0] if found else self.ec2.allocate_address(
            Domain="vpc", TagSpecifications=tags("elastic-ip", run=run, name=name, token=token,
                                                 Name=name))
        allocation = str(address["AllocationId"])
        record_effect(Effect("ec2", "elastic_ip", allocation, idempotency_key=token))
        if address.get("InstanceId") != state["instance_id"]:
            self.ec2.associate_address(AllocationId=allocation,
                                       InstanceId=state["instance_id"])
        _after(state, "attach_address")
        return {"allocation_id": allocation, "address": str(address["PublicIp"])}

    def create_record(self, state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        _before(state, "create_record")
        name, run, address = state["name"], run_id(config), state["address"]
        zone_id = self._zone(create=True)
        assert zone_id is not None
        fqdn = f"{name}.{self.zone}."
        found, owner = self._records(zone_id, fqdn)
        if found is None and owner is None:
            # The record and its owner in one batch: both are made, or neither.
            try:
                self._change(zone_id, "CREATE", fqdn, address, run)
                found, owner = address, owner_text(run)
            except ClientError as exc:
                if error_code(exc) != "InvalidChangeBatch":
                    raise
                found, owner = self._records(zone_id, fqdn)  # another's, made meanwhile
        if owner != owner_text(run):
            raise NotOwned(f"{fqdn} exists ({found}) and no run owns it, or another does "
                           f"({owner}): remove it or choose another name")
        if found != address:
            raise ProvisioningFailed(f"{fqdn} points at {found}, not at this run's {address}: "
                                     "an operator must look")
        record_effect(Effect("route53", "dns_record", record_id(fqdn, run),
                             idempotency_key=effect_key()))
        _after(state, "create_record")
        return {"record": {"name": fqdn, "value": address}}

    def _zone(self, *, create: bool) -> str | None:
        """The hosted zone's id: made by the first run that needs it (CallerReference names
        it, so two runs making it at once make one on AWS), then found by its name."""
        zones = sorted(z["Id"] for z in self.route53.list_hosted_zones_by_name(
            DNSName=self.zone)["HostedZones"] if z["Name"] == f"{self.zone}.")
        if zones or not create:
            return zones[0] if zones else None
        try:
            return str(self.route53.create_hosted_zone(
                Name=self.zone, CallerReference=f"stateguard:{self.zone}")["HostedZone"]["Id"])
        except ClientError as exc:
            if error_code(exc) != "HostedZoneAlreadyExists":
                raise
            return self._zone(create=False)

    def _records(self, zone_id: str, fqdn: str) -> tuple[str | None, str | None]:
        """The A record's value and the owner TXT's at ``fqdn`` (None where there is none)."""
        sets = self.route53.list_resource_record_sets(
            HostedZoneId=zone_id, StartRecordName=fqdn, MaxItems="10")["ResourceRecordSets"]
        values = {s["Type"]: s["ResourceRecords"][0]["Value"] for s in sets
                  if s["Name"] == fqdn and s["Type"] in ("A", "TXT") and s.get("ResourceRecords")}
        return values.get("A"), values.get("TXT")

    def _change(self, zone_id: str, action: str, fqdn: str, address: str | None,
                run: str) -> None:
        records = [("TXT", owner_text(run))] + ([("A", address)] if address else [])
        self.route53.change_resource_record_sets(HostedZoneId=zone_id, ChangeBatch={"Changes": [
            {"Action": action, "ResourceRecordSet": {"Name": fqdn, "Type": kind, "TTL": 60,
                                                     "ResourceRecords": [{"Value": value}]}}
            for kind, value in records]})

    # -- compensations: each finds its resources by its run's tag, and removes those only --
    # Each records what it finds before removing it (the step may have died before it did),
    # then what it removed. An earlier attempt may have removed a part and lost AWS's answer:
    # then nothing is found, and ``_removed_before`` records the removal of each part the
    # ledger still has as applied that AWS no longer has, so the ledger says what AWS does.
    def delete_record(self, state: dict[str, Any], ctx: ExceptionContext) -> bool | str:
        zone_id = self._zone(create=False)
        fqdn = f"{state['name']}.{self.zone}."
        record = record_id(fqdn, ctx.run_id)
        address, owner = self._records(zone_id, fqdn) if zone_id else (None, None)
        if zone_id is None or owner != owner_text(ctx.run_id):
            # Never made, removed already, or another run's: ours is not there.
            return self._removed_before("dns_record", [], lambda _: True,
                                        lambda r: Effect("route53", "deletion",
                                                         f"{r} deleted", undoes=r)) or False
        _found(Effect("route53", "dns_record", record, idempotency_key=effect_key()))
        # Route 53 deletes a record only if it is exactly as given: changed meanwhile, it
        # refuses, and the attempt is retried on what is there then.
        self._change(zone_id, "DELETE", fqdn, address, ctx.run_id)
        record_effect(Effect("route53", "deletion", f"{record} deleted", undoes=record))
        return True

    def release_address(self, state: dict[str, Any], ctx: ExceptionContext) -> bool | str:
        found = self.ec2.describe_addresses(Filters=tag_filters(
            run=ctx.run_id, name=state["name"]))["Addresses"]
        for address in found:
            allocation = address["AllocationId"]
            _found(Effect("ec2", "elastic_ip", allocation,
                          idempotency_key=tag_of(address, TOKEN_TAG) or effect_key()))
            if address.get("AssociationId"):
                _unless_gone(self.ec2.disassociate_address, "InvalidAssociationID.NotFound",
                             AssociationId=address["AssociationId"])
            _unless_gone(self.ec2.release_address, "InvalidAllocationID.NotFound",
                         AllocationId=allocation)
            record_effect(Effect("ec2", "release", f"{allocation} released",
                                 undoes=allocation))
        alive = [a["AllocationId"] for a in found]
        return bool(found) or self._removed_before(
            "elastic_ip", alive, lambda a: self._gone(
                "InvalidAllocationID.NotFound", self.ec2.describe_addresses, AllocationIds=[a]),
            lambda a: Effect("ec2", "release", f"{a} released", undoes=a)) or False

    def terminate_instance(self, state: dict[str, Any], ctx: ExceptionContext) -> bool | str:
        # Ended ones too: an earlier attempt may have terminated them and died before the
        # ledger heard (AWS lists a terminated instance for about an hour).
        found = self._instances(tag_filters(run=ctx.run_id, name=state["name"]),
                                states=ALIVE + ENDING)
        for instance in found:
            _found(Effect("ec2", "instance", instance["InstanceId"],
                          idempotency_key=tag_of(instance, TOKEN_TAG) or effect_key()))
        alive = [i["InstanceId"] for i in found if i["State"]["Name"] in ALIVE]
        if alive:
            self.ec2.terminate_instances(InstanceIds=alive)
        ids = [i["InstanceId"] for i in found]
        for instance_id in ids:
            record_effect(Effect("ec2", "termination", f"{instance_id} terminated",
                                 undoes=instance_id))
        before = self._removed_before(
            "instance", ids, self._terminated,
            lambda i: Effect("ec2", "termination", f"{i} terminated", undoes=i))
        if not ids and not before:
            return False
        # The group cannot be deleted while an instance in it is still shutting down.
        ending = [i["InstanceId"] for i in found if i["State"]["Name"] != "terminated"]
        if ending:
            self.ec2.get_waiter("instance_terminated").wait(InstanceIds=ending,
                                                            WaiterConfig=WAIT)
        return bool(ids) or before

    def delete_group(self, state: dict[str, Any], ctx: ExceptionContext) -> bool | str:
        groups = self.ec2.describe_security_groups(Filters=[
            {"Name": "group-name", "Values": [group_name(state["name"])]},
            *tag_filters(run=ctx.run_id)])["SecurityGroups"]
        for group in groups:
            _found(Effect("ec2", "security_group", group["GroupId"],
                          idempotency_key=tag_of(group, TOKEN_TAG) or effect_key()))
            _unless_gone(self.ec2.delete_security_group, "InvalidGroup.NotFound",
                         GroupId=group["GroupId"])
            record_effect(Effect("ec2", "deletion", f"{group['GroupId']} deleted",
                                 undoes=group["GroupId"]))
        alive = [g["GroupId"] for g in groups]
        return bool(groups) or self._removed_before(
            "security_group", alive, lambda g: self._gone(
                "InvalidGroup.NotFound", self.ec2.describe_security_groups, GroupIds=[g]),
            lambda g: Effect("ec2", "deletion", f"{g} deleted", undoes=g)) or False

    @staticmethod
    def _removed_before(kind: str, alive: list[str], gone: Callable[[str], bool],
                        removal: Callable[[str], Effect]) -> str:
        """Record the removal of each part of ``kind`` the step made that the ledger still has
        as applied, that is not among ``alive`` (found and removed now) and that AWS no longer
        has (``gone``): an earlier attempt removed it, and its answer was lost. What it found,
        for the attempt's result ("" if nothing)."""
        found = [r.effect.external_id for r in step_effects()
                 if r.effect.kind == kind and r.status == EffectStatus.APPLIED
                 and r.effect.external_id not in alive and gone(r.effect.external_id)]
        for external_id in found:
            record_effect(removal(external_id))
        return (f"found {', '.join(found)} removed by an earlier attempt (its answer was "
                "lost)") if found else ""

    def _terminated(self, instance_id: str) -> bool:
        """Whether the instance is shutting down or gone (its termination was asked for)."""
        try:
            reservations = self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        except ClientError as exc:
            if error_code(exc) == "InvalidInstanceID.NotFound":
                return True
            raise
        return all(i["State"]["Name"] not in ALIVE for r in reservations for i in r["Instances"])

    @staticmethod
    def _gone(not_found: str, describe: Any, **ids: Any) -> bool:
        """Whether ``describe(**ids)`` says the thing is not there (AWS's ``not_found``)."""
        try:
            describe(**ids)
        except ClientError as exc:
            if error_code(exc) == not_found:
                return True
            raise
        return False

    def build(self) -> StateGraph[Any, Any, Any, Any]:
        builder: StateGraph[Any, Any, Any, Any] = StateGraph(ProvisionState)
        for node in NODES:
            builder.add_node(node, getattr(self, node))
        for a, b in zip([START, *NODES], [*NODES, END], strict=True):
            builder.add_edge(a, b)
        return builder


def _found(effect: Effect) -> None:
    """Record what a compensation found by its run's tag before it removes it: the ledger may
    not have it (the "ledger gap": the step's worker died between AWS's answer and its
    ``record_effect``). Recorded already, it changes nothing; recorded now, the removal that
    follows settles it ``compensated`` as for any other part."""
    record_effect(effect)


def _unless_gone(call: Any, gone: str, **kwargs: Any) -> None:
    """``call(**kwargs)``, where an answer that the thing is gone already is no error: an
    earlier attempt of the same compensation removed it and died before it could say so."""
    try:
        call(**kwargs)
    except ClientError as exc:
        if error_code(exc) != gone:
            raise


def record_names_the_address(state: dict[str, Any]) -> bool:
    """The server's DNS record points at its Elastic IP."""
    return "record" not in state or state["record"]["value"] == state.get("address")


_ZONE = re.compile(r"^(?=.{1,200}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$")


def _options(options: Mapping[str, Any], aws: AwsSettings) -> tuple[str | None, str]:
    """The image and the zone, from the deployment's options for the agent, checked. No image
    with AWS itself builds the agent (a deployment that never runs it need not name one); its
    runs then fail before any effect, saying what to set."""
    if unknown := set(options) - {"image_id", "zone"}:
        raise ConfigurationError(f"agent 'provision': unknown options {sorted(unknown)} in "
                                 "STATEGUARD_AGENT_OPTIONS (it takes image_id and zone)")
    zone = options.get("zone", "stateguard.test")
    if not isinstance(zone, str) or not _ZONE.match(zone):
        raise ConfigurationError(f"agent 'provision': option zone {zone!r} is not a DNS name "
                                 "(like stateguard.example.com)")
    image = options.get("image_id", LOCAL_IMAGE if aws.endpoint_url else None)
    if image is not None and not (isinstance(image, str)
                                  and re.fullmatch(r"ami-[0-9a-f]{8,17}", image)):
        raise ConfigurationError(f"agent 'provision': option image_id {image!r} is not an "
                                 "AMI id (ami-0123456789abcdef0)")
    return image, zone


@register("provision", version="1")
def spec(settings: AgentSettings) -> AgentSpec:
    aws = aws_settings(settings, "provision")
    image, zone = _options(settings.options_for("provision"), aws)
    agent = Provisioner(aws, image_id=image, zone=zone)
    # Every compensation finds its resources by its run's tag before it acts: each is safe
    # for a step left in doubt by a dead worker.
    return AgentSpec(
        name="provision", build=agent.build, input_schema=ProvisionInput,
        invariants=(record_names_the_address,), on_error=provision_error_policy,
        # A step whose AWS call failed without a verdict runs again: it finds what its earlier
        # attempt made (by the step's token or its run's tag) before it makes anything.
        kinds={node: Retriable(AWS_STEP_RETRY) for node in NODES},
        compensations={
            "create_group": Compensation(agent.delete_group, in_doubt_safe=True),
            "launch_instance": Compensation(agent.terminate_instance, in_doubt_safe=True),
            "attach_address": Compensation(agent.release_address, in_doubt_safe=True),
            "create_record": Compensation(agent.delete_record, in_doubt_safe=True),
        },
        description="Provision a server on AWS: a security group, an instance, an Elastic "
                    "IP and its DNS record.")
