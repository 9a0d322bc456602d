"""What a test sees of the local AWS (moto's server, the ``aws`` fixture): boto3 clients on it,
and what is alive there, counted through the API as an operator would."""

from __future__ import annotations

from typing import Any

from agents.aws import NAME_TAG, RUN_TAG, client, tag_of
from agents.registry import AwsSettings

ALIVE = ["pending", "running", "stopping", "stopped"]


class AwsWorld:
    def __init__(self, settings: AwsSettings) -> None:
        self.settings = settings
        self.ec2 = client(settings, "ec2")
        self.route53 = client(settings, "route53")
        self.s3 = client(settings, "s3")

    def live(self) -> dict[str, list[str]]:
        """The servers' parts that exist, each by the name its run was asked for (a record by
        its DNS name): what a failed run must leave none of."""
        return {"groups": self.groups(), "instances": self.instances(),
                "addresses": sorted(str(tag_of(a, NAME_TAG)) for a in self._addresses()),
                "records": self.records()}

    def groups(self) -> list[str]:
        return sorted(str(tag_of(g, NAME_TAG)) for g in self._groups())

    def instances(self, *, alive: bool = True) -> list[str]:
        """The instances' names; with ``alive=False`` the terminated ones too (what was ever
        launched)."""
        return sorted(str(tag_of(i, NAME_TAG)) for i in self._instances(alive=alive))

    def records(self) -> list[str]:
        zones = self.route53.list_hosted_zones()["HostedZones"]
        return sorted(s["Name"] for z in zones for s in self.route53.list_resource_record_sets(
            HostedZoneId=z["Id"])["ResourceRecordSets"] if s["Type"] == "A")

    def owners(self) -> dict[str, set[str]]:
        """Each name's owners: the runs its groups, live instances and addresses are tagged
        with."""
        found: dict[str, set[str]] = {}
        for thing in [*self._groups(), *self._instances(alive=True), *self._addresses()]:
            found.setdefault(str(tag_of(thing, NAME_TAG)), set()).add(str(tag_of(thing, RUN_TAG)))
        return found

    def _groups(self) -> list[dict[str, Any]]:
        return [g for g in self.ec2.describe_security_groups()["SecurityGroups"]
                if g["GroupName"] != "default"]

    def _instances(self, *, alive: bool) -> list[dict[str, Any]]:
        filters = [{"Name": "instance-state-name", "Values": ALIVE}] if alive else []
        return [i for r in self.ec2.describe_instances(Filters=filters)["Reservations"]
                for i in r["Instances"]]

    def _addresses(self) -> list[dict[str, Any]]:
        return list(self.ec2.describe_addresses()["Addresses"])
