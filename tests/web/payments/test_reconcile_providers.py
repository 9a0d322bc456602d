"""manage.py reconcile_effects beyond Stripe: the ledger compared with moto's server (EC2,
Route 53, S3) and with a real SMTP server's mailbox, drift reported one line each, and with
--fix, what the provider shows for a run recorded under the step that made it.

The providers' things are made here as the agents make them (the same tags, tokens and
headers), and the ledger rows as the journal records them; tests/web/payments/
test_reconcile_agents.py runs the agents themselves."""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import TestCase
from django.utils import timezone

from agents.aws import TOKEN_TAG, tags
from agents.cleanup import OWNER_TAG
from agents.mail import Mailer
from agents.provision import owner_text, record_id
from stateguard.effects import Effect as CoreEffect
from stateguard.effects import EffectRecord, effect_key
from stateguard_web.runs import runtime
from stateguard_web.sagas.models import AuditEvent, Compensation, Effect, Run, Step
from tests.aws_world import AwsWorld
from tests.mail_server import MailServer


def reconcile(*args: str) -> tuple[int, list[str]]:
    """Run the command in this process; its exit status and its lines."""
    out = io.StringIO()
    try:
        call_command("reconcile_effects", *args, stdout=out)
        status = 0
    except CommandError as exc:
        status = exc.returncode
        out.write(f"{exc}\n")
    return status, out.getvalue().splitlines()


def step(run: Run, node: str) -> Step:
    return Step.objects.create(run=run, step_id=f"{run.code}-{node}", node=node,
                               status=Step.Status.SUCCEEDED, started_at=timezone.now())


def key_of(run: Run, node: str) -> str:
    """The idempotency key the step ``node`` of ``run`` made its effect with."""
    return effect_key(run_id=str(run.code), step_id=f"{run.code}-{node}")


def record(run: Run, node: str, provider: str, kind: str, external_id: str,
           **extra: Any) -> None:
    """Into the ledger, as the step's record_effect puts it."""
    runtime.journal().effect_record(EffectRecord(str(run.code), f"{run.code}-{node}", node,
                                                 CoreEffect(provider, kind, external_id,
                                                            **extra)))


def ledger(external_id: str) -> Effect:
    return Effect.objects.get(external_id=external_id)


class OnMoto(TestCase):
    """Mixed in: moto's server, emptied, and the app's AWS settings naming it."""

    aws: AwsWorld

    @pytest.fixture(autouse=True)
    def _aws(self, aws: AwsWorld, settings: Any) -> None:
        self.aws = aws


class AwsTests(OnMoto):
    def setUp(self) -> None:
        get_user_model().objects.create_user("bob")
        self.run = Run.objects.create(agent="provision", status=Run.Status.SUCCEEDED)
        for node in ("create_group", "launch_instance", "attach_address", "create_record"):
            step(self.run, node)

    def server(self, run: Run, name: str) -> dict[str, str]:
        """A server's parts at AWS as the provision agent makes them, tagged with ``run``."""
        code, ec2 = str(run.code), self.aws.ec2
        group = ec2.create_security_group(
            GroupName=f"stateguard-{name}", Description=name,
            TagSpecifications=tags("security-group", run=code, name=name,
                                   token=key_of(run, "create_group")))["GroupId"]
        instance = ec2.run_instances(
            ImageId="ami-12c6146b", MinCount=1, MaxCount=1, SecurityGroupIds=[group],
            ClientToken=key_of(run, "launch_instance"),
            TagSpecifications=tags("instance", run=code, name=name,
                                   token=key_of(run, "launch_instance")))["Instances"][0]
        address = ec2.allocate_address(Domain="vpc", TagSpecifications=tags(
            "elastic-ip", run=code, name=name, token=key_of(run, "attach_address")))
        zone = self.aws.route53.create_hosted_zone(
            Name="stateguard.test", CallerReference=f"zone-{name}")["HostedZone"]["Id"]
        fqdn = f"{name}.stateguard.test."
        self.aws.route53.change_resource_record_sets(HostedZoneId=zone, ChangeBatch={
            "Changes": [{"Action": "CREATE", "ResourceRecordSet": {
                "Name": fqdn, "Type": kind, "TTL": 60, "ResourceRecords": [{"Value": value}]}}
                for kind, value in [("TXT", owner_text(code)), ("A", address["PublicIp"])]]})
        return {"group": group, "instance": instance["InstanceId"],
                "address": address["AllocationId"], "record": record_id(fqdn, code)}

    def test_it_finds_a_part_aws_holds_for_a_run_and_fix_records_it_under_its_step(self) -> None:
        """The worker died between AllocateAddress and record_effect: the ledger gap."""
        made = self.server(self.run, "web-1")
        record(self.run, "create_group", "ec2", "security_group", made["group"])
        record(self.run, "launch_instance", "ec2", "instance", made["instance"])
        record(self.run, "create_record", "route53", "dns_record", made["record"])
        code = self.run.code

        status, lines = reconcile("--provider", "aws")
        assert (status, lines) == (1, [
            f"DRIFT {made['address']} (run {code}): Elastic IP {made['address']} (web-1) "
            f"tagged with run {code} is at AWS, not in the ledger",
            "4 resource(s) compared with AWS: 1 drift(s)",
            "1 drift(s) remain (--fix records what the providers show)"])

        status, lines = reconcile("--provider", "aws", "--fix", "--by", "bob")
        assert status == 0, lines
        assert lines[0] == f"FIXED {made['address']} (run {code}): Elastic IP " \
                           f"{made['address']} (web-1) tagged with run {code} is at AWS, " \
                           "not in the ledger: recorded"
        found = ledger(made["address"])
        assert (found.run_id, found.provider, found.kind, found.node, found.step_id,
                found.idempotency_key, found.status) == (
            self.run.pk, "ec2", "elastic_ip", "attach_address", f"{code}-attach_address",
            key_of(self.run, "attach_address"), Effect.Status.APPLIED)
        [event] = AuditEvent.objects.filter(action="effect.reconciled")
        assert (event.actor, event.data["provider"], event.data["effect"]) == (
            "bob", "ec2", made["address"])
        assert reconcile("--provider", "aws") == (
            0, ["4 resource(s) compared with AWS: 0 drift(s)"])

    def test_it_reports_leaks_and_parts_aws_lacks_and_records_a_termination(self) -> None:
        made = self.server(self.run, "web-1")
        ec2, code = self.aws.ec2, self.run.code
        # Undone in the ledger, still running at AWS: a leak.
        record(self.run, "launch_instance", "ec2", "instance", made["instance"])
        record(self.run, "launch_instance", "ec2", "termination",
               f"{made['instance']} terminated", undoes=made["instance"])
        # Applied in the ledger, gone at AWS (deleted in the console, say).
        record(self.run, "attach_address", "ec2", "elastic_ip", made["address"])
        ec2.release_address(AllocationId=made["address"])
        # Applied in the ledger, terminated at AWS: the termination's record was lost.
        other = Run.objects.create(agent="provision")
        step(other, "launch_instance")
        [ended] = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1,
                                    TagSpecifications=tags("instance", run=str(other.code),
                                                           name="db-1"))["Instances"]
        ended_id = ended["InstanceId"]
        record(other, "launch_instance", "ec2", "instance", ended_id)
        ec2.terminate_instances(InstanceIds=[ended_id])
        # Tagged with a run the journal does not have (pruned, or another deployment's).
        stray = ec2.allocate_address(Domain="vpc", TagSpecifications=tags(
            "elastic-ip", run="not-a-run", name="x"))["AllocationId"]
        # The group and the record, in the ledger as at AWS.
        record(self.run, "create_group", "ec2", "security_group", made["group"])
        record(self.run, "create_record", "route53", "dns_record", made["record"])

        status, lines = reconcile("--provider", "aws", "--fix")

        assert status == 1
        assert sorted(lines[:-2]) == sorted([
            f"DRIFT {made['instance']} (run {code}): compensated in the ledger; instance "
            f"{made['instance']} (web-1) is still at AWS",
            f"DRIFT {made['address']} (run {code}): applied in the ledger; AWS has no such "
            "Elastic IP (removed outside the ledger, or by an undo whose record was lost)",
            f"FIXED {ended_id} (run {other.code}): terminated at AWS, applied in the ledger: "
            "recorded",
            f"DRIFT {stray} (run not-a-run): Elastic IP {stray} (x) tagged with run not-a-run "
            "is at AWS, not in the ledger; its run is not in the journal, so it is not "
            "recorded"])
        assert lines[-2:] == ["6 resource(s) compared with AWS: 3 drift(s), 1 fixed",
                              "3 drift(s) remain"]
        termination = ledger(f"{ended_id} terminated")
        assert (termination.undoes, termination.node, ledger(ended_id).status) == (
            ended_id, "launch_instance", Effect.Status.COMPENSATED)
        assert not Effect.objects.filter(external_id=stray).exists()

    def test_aws_out_of_reach_is_said_and_the_others_are_still_compared(self) -> None:
        with self.settings(AWS_ENDPOINT_URL="http://127.0.0.1:9", STRIPE_API_KEY="",
                           STATEGUARD_MAIL_DIR=None):
            status, lines = reconcile()
        assert status == 1
        assert lines[0] == "SKIPPED stripe: not configured here: STRIPE_API_KEY is empty"
        assert lines[1].startswith("could not read AWS: AWS could not be reached at "
                                   "http://127.0.0.1:9: ")
        assert lines[2].startswith("could not read S3: AWS could not be reached at ")
        assert lines[3].startswith("SKIPPED smtp: not configured here: STATEGUARD_MAIL_DIR "
                                   "names no folder")
        assert lines[4] == "not compared: aws, s3"

    def test_by_default_it_compares_every_provider_configured_and_skips_the_others(
            self) -> None:
        with self.settings(STRIPE_API_KEY="", STATEGUARD_MAIL_DIR=None):
            assert reconcile() == (0, [
                "SKIPPED stripe: not configured here: STRIPE_API_KEY is empty",
                "0 resource(s) compared with AWS: 0 drift(s)",
                "0 delete marker(s) compared with S3: 0 drift(s)",
                "SKIPPED smtp: not configured here: STATEGUARD_MAIL_DIR names no folder: the "
                "SMTP server keeps no mailbox this deployment can read (make run's does)"])
            # Asked for by name, a provider not configured here is a failure.
            status, lines = reconcile("--provider", "smtp", "--provider", "aws")
            assert status == 1 and lines[-1] == "not compared: smtp"
        with pytest.raises(CommandError, match="invalid choice: 'ftp'"):
            call_command("reconcile_effects", "--provider", "ftp")


BUCKET = "reports"


class S3Tests(OnMoto):
    def setUp(self) -> None:
        self.run = Run.objects.create(agent="cleanup")
        step(self.run, "delete_object")
        s3 = self.aws.s3
        s3.create_bucket(Bucket=BUCKET)
        s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})

    def delete(self, key: str, run: Run | None = None) -> str:
        """``key`` written, then deleted as the cleanup agent deletes it (its version tagged
        with the run first); the ledger's id of the delete marker."""
        s3 = self.aws.s3
        version = s3.put_object(Bucket=BUCKET, Key=key, Body=b"data")["VersionId"]
        run = run or self.run
        s3.put_object_tagging(Bucket=BUCKET, Key=key, VersionId=version, Tagging={
            "TagSet": [{"Key": OWNER_TAG, "Value": str(run.code)},
                       {"Key": TOKEN_TAG, "Value": key_of(run, "delete_object")}]})
        return f"{BUCKET}@{s3.delete_object(Bucket=BUCKET, Key=key)['VersionId']}"

    def test_it_compares_delete_markers_with_the_buckets_versions(self) -> None:
        code = self.run.code
        kept = self.delete("kept.csv")  # deleted, in the ledger: as it should be
        record(self.run, "delete_object", "s3", "delete_marker", kept)
        lost = self.delete("lost.csv")  # deleted, the ledger never heard (the gap)
        restored = self.delete("restored.csv")  # the ledger says deleted: S3, restored
        record(self.run, "delete_object", "s3", "delete_marker", restored)
        self.aws.s3.delete_object(Bucket=BUCKET, Key="restored.csv",
                                  VersionId=restored.partition("@")[2])
        still = self.delete("still.csv")  # the ledger says restored: S3, still deleted
        record(self.run, "delete_object", "s3", "delete_marker", still)
        record(self.run, "delete_object", "s3", "restore", f"{still} removed", undoes=still)

        status, lines = reconcile("--provider", "s3", "--fix")

        assert status == 1
        assert sorted(lines[:-2]) == sorted([
            f"FIXED {lost} (run {code}): the delete marker of s3://{BUCKET}/lost.csv (version "
            f"tagged {OWNER_TAG}={code}) is at S3, not in the ledger: recorded",
            f"DRIFT {restored} (run {code}): applied in the ledger; S3 has no such delete "
            "marker (removed outside the ledger, or by a restore whose record was lost: the "
            "file may be back, or gone for good)",
            f"DRIFT {still} (run {code}): compensated in the ledger; the delete marker of "
            f"s3://{BUCKET}/still.csv is still at S3 (the file is still deleted)"])
        assert lines[-2:] == ["4 delete marker(s) compared with S3: 2 drift(s), 1 fixed",
                              "2 drift(s) remain"]
        # Under the step its version's token names.
        assert (ledger(lost).node, ledger(lost).step_id) == ("delete_object",
                                                             f"{code}-delete_object")
        assert ledger(lost).status == Effect.Status.APPLIED and ledger(kept).status == "applied"

    def test_a_marker_stacked_on_a_runs_delete_is_not_the_runs(self) -> None:
        marker = self.delete("twice.csv")
        self.aws.s3.delete_object(Bucket=BUCKET, Key="twice.csv")  # deleted again, by hand
        status, lines = reconcile("--provider", "s3")
        assert status == 1, lines
        assert lines[0].startswith(f"DRIFT {marker} (run {self.run.code}): ")
        assert lines[1] == "1 delete marker(s) compared with S3: 1 drift(s)"


class SmtpTests(TestCase):
    server: MailServer

    @pytest.fixture(autouse=True)
    def _mail(self, mail_server: MailServer, settings: Any) -> Iterator[None]:
        self.server = mail_server
        mail_server.use_in(settings)
        yield

    def setUp(self) -> None:
        self.run = Run.objects.create(agent="travel", status=Run.Status.COMPENSATED)
        sent = step(self.run, "send_confirmation")
        self.mailer = Mailer(self.server.settings())
        self.apology_key = "sg-0123456789abcdef0123456789abcdef"
        Compensation.objects.create(run=self.run, step=sent, node="send_confirmation",
                                    idempotency_key=self.apology_key,
                                    status=Compensation.Status.SUCCEEDED)

    def send(self, key: str, reply_to: str = "", times: int = 1) -> str:
        message_id = self.mailer.message_id(key)
        message = self.mailer.compose(to="a@b.co", subject="Cancelled" if reply_to else "Booked",
                                      body="...", message_id=message_id, run=str(self.run.code),
                                      in_reply_to=reply_to)
        for _ in range(times):
            self.mailer.send(message)
        return message_id

    def test_it_compares_the_ledgers_mail_with_the_servers_mailbox(self) -> None:
        code = self.run.code
        confirmation = self.send(key_of(self.run, "send_confirmation"))
        record(self.run, "send_confirmation", "smtp", "email", confirmation)
        # The apology went out and its compensation died before recording it.
        apology = self.send(self.apology_key, reply_to=confirmation)

        status, lines = reconcile("--provider", "smtp")
        assert (status, lines[:2]) == (1, [
            f'DRIFT {apology} (run {code}): message "Cancelled" accepted by the server, not in '
            "the ledger", "2 message(s) compared with the SMTP server: 1 drift(s)"])

        assert reconcile("--provider", "smtp", "--fix")[0] == 0
        found = ledger(apology)
        # Under the step its compensation undid (its Message-ID carries that key), undoing
        # the confirmation, which the ledger settles: the apology answered it.
        assert (found.node, found.step_id, found.undoes, found.idempotency_key) == (
            "send_confirmation", f"{code}-send_confirmation", confirmation, self.apology_key)
        assert ledger(confirmation).status == Effect.Status.COMPENSATED
        assert reconcile("--provider", "smtp") == (
            0, ["2 message(s) compared with the SMTP server: 0 drift(s)"])

    def test_it_reports_mail_sent_twice_and_mail_never_accepted(self) -> None:
        twice = self.send(key_of(self.run, "send_confirmation"), times=2)
        record(self.run, "send_confirmation", "smtp", "email", twice)
        never = "<sg-effect-never@shop.test>"
        record(self.run, "send_confirmation", "smtp", "email", never)

        status, lines = reconcile("--provider", "smtp", "--fix")

        assert status == 1
        assert lines[:2] == [
            f"DRIFT {twice} (run {self.run.code}): accepted 2 times by the server: its "
            "recipient got it 2 times",
            f"DRIFT {never} (run {self.run.code}): in the ledger; the server's mailbox has no "
            "message with this Message-ID (never accepted)"]

    def test_since_leaves_out_what_came_before(self) -> None:
        self.send(key_of(self.run, "send_confirmation"))
        later = (timezone.now() + timedelta(minutes=30)).isoformat()
        assert reconcile("--provider", "smtp", "--since", later) == (
            0, ["0 message(s) compared with the SMTP server: 0 drift(s)"])

    def test_a_folder_that_is_not_the_servers_is_not_read(self) -> None:
        with self.settings(EMAIL_PORT=self.server.port + 1):
            status, lines = reconcile("--provider", "smtp")
        assert (status, lines[-1]) == (1, "not compared: smtp")
        assert lines[0].startswith("SKIPPED smtp: not configured here: ")
        assert "is not the mailbox of the SMTP server at 127.0.0.1:" in lines[0]
