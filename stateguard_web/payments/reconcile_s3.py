"""Reconciliation with S3 (``drift.Reconciler``): the delete markers the ledger records (provider
``s3``, kind ``delete_marker``, id ``<bucket>@<the marker's version id>``: the cleanup agent's)
and their removals (``restore``), against each bucket's versions (``ListObjectVersions``), through
boto3 with this deployment's ``AWS_*`` settings.

Buckets looked at: those of the ledger's markers in scope, and those the cleanup agent may
delete from (``STATEGUARD_AGENT_OPTIONS={"cleanup": {"buckets": [...]}}``; with none named,
every bucket of a local stand-in, ``ListBuckets``, and none more of AWS's). In each, every key
whose current entry is a delete marker is a deleted file; its newest version's
``stateguard:deleted-by`` tag names the run that deleted it and ``stateguard:token`` the step
(``GetObjectTagging``, one call per deleted file), and the oldest marker above that version is
that run's delete.

Drift, one line each:

* a run's delete marker at S3 that the ledger lacks (the step died between S3's answer and
  ``record_effect``): ``fix`` records it, for a run the journal has;
* a marker the ledger holds as applied (the file deleted) that S3 no longer has: removed
  outside the ledger, or by a restore whose record was lost (the file may be back, or gone for
  good: a person looks);
* a marker the ledger holds as compensated (the file restored) that S3 still has: the file is
  still deleted.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError
from django.conf import settings

from agents.aws import TOKEN_TAG, client, error_code
from agents.cleanup import OWNER_TAG
from stateguard.effects import Effect as CoreEffect
from stateguard_web.payments.drift import Report, Scope, record_found, run_of
from stateguard_web.payments.reconcile_aws import OnAws
from stateguard_web.runs import runtime
from stateguard_web.sagas.models import Effect

__all__ = ["S3Reconciler"]

S3 = "s3"


@dataclass(frozen=True, slots=True)
class Marker:
    bucket: str
    key: str
    version_id: str
    last_modified: datetime

    @property
    def ledger_id(self) -> str:
        return f"{self.bucket}@{self.version_id}"  # as agents.cleanup records it

    def __str__(self) -> str:
        return f"the delete marker of s3://{self.bucket}/{self.key}"


@dataclass(slots=True)
class Bucket:
    """A bucket's delete markers by version id, and its deleted files: each key whose current
    entry is a marker, with its newest version (or none)."""

    name: str
    markers: dict[str, Marker]
    deleted: list[tuple[str, dict[str, Any] | None, list[Marker]]]  # key, version, markers


class S3Reconciler(OnAws):
    name, title = "s3", "S3"

    def compare(self, scope: Scope) -> Report:
        return _Pass(scope).run()


class _Pass:
    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.s3 = client(runtime.aws_settings(), "s3")
        self.report = Report("S3", "delete marker")

    def run(self) -> Report:
        ledger = [e for e in self.scope.ledger([S3]) if e.kind == "delete_marker"]
        named = {e.external_id.rpartition("@")[0] for e in ledger}
        compared: set[str] = set()
        for name in sorted(named | self.agents_buckets()):
            bucket = self.bucket(name)
            mine = [e for e in ledger if e.external_id.rpartition("@")[0] == name]
            compared |= {e.external_id for e in mine}
            if bucket is None:
                for e in mine:
                    self.compare(e, None, gone=f"S3 has no bucket {name}")
                continue
            for e in mine:
                self.compare(e, bucket.markers.get(e.external_id.rpartition("@")[2]))
            compared |= self.unrecorded(bucket)
        self.report.compared = len(compared)
        return self.report

    def agents_buckets(self) -> set[str]:
        """The buckets the cleanup agent may delete from: those its options name; with none
        named, every bucket of a local stand-in (as the agent itself), none of AWS's."""
        named = settings.STATEGUARD_AGENT_OPTIONS.get("cleanup", {}).get("buckets")
        if named is not None:
            return {str(b) for b in named}
        if not settings.AWS_ENDPOINT_URL:
            return set()
        return {b["Name"] for b in self.s3.list_buckets().get("Buckets", [])}

    def bucket(self, name: str) -> Bucket | None:
        try:
            pages = list(self.s3.get_paginator("list_object_versions").paginate(Bucket=name))
        except ClientError as exc:
            if error_code(exc) == "NoSuchBucket":
                return None
            raise
        versions: dict[str, list[dict[str, Any]]] = {}
        markers: dict[str, list[Marker]] = {}
        latest: set[str] = set()  # the keys whose current entry is a marker
        for page in pages:
            for v in page.get("Versions", []):
                versions.setdefault(v["Key"], []).append(v)
            for m in page.get("DeleteMarkers", []):
                markers.setdefault(m["Key"], []).append(
                    Marker(name, m["Key"], m["VersionId"], m["LastModified"]))
                if m["IsLatest"]:
                    latest.add(m["Key"])
        deleted = []
        for key in sorted(latest):
            newest = max(versions.get(key, []), key=lambda v: v["LastModified"], default=None)
            deleted.append((key, newest, markers[key]))
        return Bucket(name, {m.version_id: m for ms in markers.values() for m in ms}, deleted)

    def compare(self, effect: Effect, marker: Marker | None, gone: str = "") -> None:
        run, undone = str(effect.run.code), effect.status == Effect.Status.COMPENSATED
        if marker is None and not undone:
            self.report.add(effect.external_id, run, f"{effect.status} in the ledger; "
                            + (gone or "S3 has no such delete marker (removed outside the "
                                       "ledger, or by a restore whose record was lost: the "
                                       "file may be back, or gone for good)"))
        elif marker is not None and undone:
            self.report.add(effect.external_id, run, f"compensated in the ledger; {marker} is "
                                                     "still at S3 (the file is still deleted)")

    def unrecorded(self, bucket: Bucket) -> set[str]:
        """The runs' delete markers in ``bucket`` that the ledger lacks; the ids looked at."""
        looked = set()
        for marker, owner, key in self.owned(bucket):
            looked.add(marker.ledger_id)
            if Effect.objects.filter(provider=S3, external_id=marker.ledger_id).exists():
                continue
            what = (f"{marker} (version tagged {OWNER_TAG}={owner}) is at S3, not in the "
                    "ledger")
            run = run_of(owner)
            if run is None:
                self.report.add(marker.ledger_id, owner, f"{what}; its run is not in the "
                                                         "journal, so it is not recorded")
            elif self.scope.fix:
                record_found(run=run, key=key, by=self.scope.by, effect=CoreEffect(
                    S3, "delete_marker", marker.ledger_id, idempotency_key=key))
                self.report.add(marker.ledger_id, owner, f"{what}: recorded", fixed=True)
            else:
                self.report.add(marker.ledger_id, owner, what)
        return looked

    def owned(self, bucket: Bucket) -> Iterator[tuple[Marker, str, str]]:
        """Each deleted file's delete by a run: the oldest marker above its newest version,
        when that version carries the run's tag; with the run and its step's key."""
        for key, version, markers in bucket.deleted:
            if version is None:
                continue
            above = [m for m in markers if m.last_modified >= version["LastModified"]]
            if not above:
                continue
            tags = self.s3.get_object_tagging(Bucket=bucket.name, Key=key,
                                              VersionId=version["VersionId"])["TagSet"]
            owner = next((t["Value"] for t in tags if t["Key"] == OWNER_TAG), None)
            token = next((t["Value"] for t in tags if t["Key"] == TOKEN_TAG), "")
            # S3 lists the newest first: on a tie of times, the later in the list is older.
            first = min(reversed(above), key=lambda m: m.last_modified)
            if owner and self.scope.covers(owner, first.last_modified):
                yield first, owner, token
