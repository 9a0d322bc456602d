"""The "cleanup" agent: it deletes a file from S3, and its compensation brings the very file back.

In a bucket with versioning on, a delete hides the object under a *delete marker* and keeps
its bytes; removing that marker makes the hidden version current again: the same bytes, the
same version id. So:

- ``delete_object`` refuses a bucket whose versioning is not on (a delete there could not be
  undone), before any effect; tags the current version ``stateguard:deleted-by=<run>`` (its
  owner: the tag is how a compensation, or the step run again, knows which version this run
  deleted, also when the step died before its result was saved) and ``stateguard:token=<the
  step's effect_key()>`` (which step: a reconciliation records a delete it finds under it);
  then deletes the object.
- ``verify_gone`` checks that the key answers 404 now (``fail_at`` there simulates a failure
  after the delete).
- The compensation (``restore_object``, ``in_doubt_safe``) finds the version tagged with its
  run, removes the delete markers stacked on it (this run's, and any later delete of the same
  already deleted file), and takes its tags off: the object is back exactly, tags included. It
  removes nothing when no version carries its run's tag, and leaves the key alone when someone
  wrote it again since (the newer object stays current).

Each delete marker and each removal goes into the effect ledger; the compensation records the
marker it finds too (the step may have died before it could), and the removal an earlier
attempt of its own made and could not record (``manage.py reconcile_effects --provider s3``
compares the ledger with the bucket's versions). Options
(``STATEGUARD_AGENT_OPTIONS={"cleanup": {"buckets": [...]}}``): the buckets the agent may delete
from; with AWS itself none until named, any bucket of the local stand-in.
"""

from __future__ import annotations

import re
from functools import cached_property
from typing import Any, Literal, TypedDict

from botocore.exceptions import ClientError
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from pydantic import Field

from agents.aws import TOKEN_TAG, aws_settings, client, error_code
from agents.registry import AgentInput, AgentSettings, AgentSpec, AwsSettings, register, run_id
from stateguard import (
    Compensation,
    ConfigurationError,
    Effect,
    ExceptionContext,
    effect_key,
    record_effect,
)

NODES = ("delete_object", "verify_gone")
OWNER_TAG = "stateguard:deleted-by"
MAX_TAGS = 10  # S3's limit per object version
OURS = (OWNER_TAG, TOKEN_TAG)  # the tags a delete adds, and its undo takes off


class CleanupInput(AgentInput):
    bucket: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    key: str = Field(min_length=1, max_length=512, pattern=r"^[^\x00-\x1f\x7f]+$")
    fail_at: Literal["delete_object", "verify_gone"] | None = None
    hold_failure: bool = False


class CleanupState(TypedDict, total=False):
    bucket: str
    key: str
    fail_at: str | None
    hold_failure: bool
    deleted_version: str
    delete_marker: str
    gone: bool


class CleanupFailed(Exception):
    pass


class SimulatedFailure(CleanupFailed):
    def __init__(self, message: str, *, hold: bool) -> None:
        super().__init__(message)
        self.hold = hold


def cleanup_error_policy(exc: BaseException) -> Literal["compensate", "hold"]:
    return "hold" if isinstance(exc, SimulatedFailure) and exc.hold else "compensate"


def _before(state: dict[str, Any], node: str) -> None:
    if state.get("fail_at") == node:
        raise SimulatedFailure(f"{node} failed for s3://{state['bucket']}/{state['key']}",
                               hold=bool(state.get("hold_failure")))


def _marker_id(bucket: str, marker: str) -> str:
    """The ledger's id of a delete marker: its version id, unique in its bucket."""
    return f"{bucket}@{marker}"


class Cleaner:
    def __init__(self, aws: AwsSettings, *, buckets: frozenset[str] | None) -> None:
        self.aws, self.buckets = aws, buckets

    @cached_property
    def s3(self) -> Any:
        return client(self.aws, "s3")

    # -- nodes --------------------------------------------------------------------------
    def delete_object(self, state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        _before(state, "delete_object")
        bucket, key, run = state["bucket"], state["key"], run_id(config)
        where = f"s3://{bucket}/{key}"
        if self.buckets is not None and bucket not in self.buckets:
            raise CleanupFailed(f"bucket {bucket} is not one this deployment lets the agent "
                                f"delete from ({', '.join(sorted(self.buckets)) or 'none'}: "
                                'STATEGUARD_AGENT_OPTIONS={"cleanup": {"buckets": [...]}})')
        versioning = self.s3.get_bucket_versioning(Bucket=bucket).get("Status")
        if versioning != "Enabled":
            raise CleanupFailed(f"versioning is {(versioning or 'off').lower()} on bucket "
                                f"{bucket}: a delete there could not be undone; turn it on first")
        latest, newest = self._latest(bucket, key)
        owner = self._owner(bucket, key, newest) if newest else None
        if owner not in (None, run):
            raise CleanupFailed(f"{where} is being deleted by run {owner}")
        if latest is not None and latest.get("marker") and owner == run:
            marker = latest["VersionId"]  # this step's earlier run deleted it already
        elif latest is None or latest.get("marker"):
            raise CleanupFailed(f"{where} does not exist (deleted already, or never written)")
        else:
            if owner is None:
                self._tag(bucket, key, latest["VersionId"], run)
            marker = self.s3.delete_object(Bucket=bucket, Key=key)["VersionId"]
        assert newest is not None
        record_effect(Effect("s3", "delete_marker", _marker_id(bucket, marker),
                             idempotency_key=effect_key()))
        return {"deleted_version": newest["VersionId"], "delete_marker": marker}

    def verify_gone(self, state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        _before(state, "verify_gone")
        try:
            self.s3.head_object(Bucket=state["bucket"], Key=state["key"])
        except ClientError as exc:
            if error_code(exc) in ("404", "NoSuchKey"):
                return {"gone": True}
            raise
        raise CleanupFailed(f"s3://{state['bucket']}/{state['key']} is still there")

    # -- the compensation ---------------------------------------------------------------
    def restore_object(self, state: dict[str, Any], ctx: ExceptionContext) -> bool:
        bucket, key = state["bucket"], state["key"]
        latest, newest = self._latest(bucket, key)
        if newest is None or self._owner(bucket, key, newest) != ctx.run_id:
            return False  # no version this run deleted: never deleted, or restored already
        if latest is not None and latest.get("marker"):
            # The markers on top of this run's version, newest first (one, unless the gone
            # file was deleted again since). Removing the last makes the version current.
            markers = self._markers_on(bucket, key, newest)
            # The oldest is this run's delete: recorded here too, as the step may have died
            # between S3's answer and its own record (recorded already, it changes nothing).
            record_effect(Effect("s3", "delete_marker", _marker_id(bucket, markers[-1]),
                                 idempotency_key=effect_key()))
            for marker in markers:
                self.s3.delete_object(Bucket=bucket, Key=key, VersionId=marker)
                done = _marker_id(bucket, marker)
                record_effect(Effect("s3", "restore", f"{done} removed", undoes=done))
        elif state.get("delete_marker") and not self._has_marker(bucket, key,
                                                                 state["delete_marker"]):
            # An earlier attempt removed the step's marker and died before it said so.
            done = _marker_id(bucket, state["delete_marker"])
            record_effect(Effect("s3", "restore", f"{done} removed", undoes=done))
        # Its tags as they were before this run marked it; also when an earlier attempt
        # removed the markers and died before this.
        self._untag(bucket, key, newest["VersionId"])
        return True

    # -- S3 ------------------------------------------------------------------------------
    def _listing(self, bucket: str, key: str) -> tuple[list[dict[str, Any]],
                                                       list[dict[str, Any]]]:
        """The key's versions and delete markers, each newest first."""
        found = self.s3.list_object_versions(Bucket=bucket, Prefix=key)
        if found.get("IsTruncated"):
            raise CleanupFailed(f"s3://{bucket}/{key} has more versions than one page: an "
                                "operator must look")
        versions = [v for v in found.get("Versions", []) if v["Key"] == key]
        markers = [m for m in found.get("DeleteMarkers", []) if m["Key"] == key]
        return versions, markers

    def _latest(self, bucket: str, key: str) -> tuple[dict[str, Any] | None,
                                                      dict[str, Any] | None]:
        """The key's current entry (a version, or a delete marker: ``"marker": True``) and its
        newest version (hidden, when the current entry is a marker)."""
        versions, markers = self._listing(bucket, key)
        latest = next(({**m, "marker": True} for m in markers if m["IsLatest"]),
                      next((v for v in versions if v["IsLatest"]), None))
        return latest, versions[0] if versions else None

    def _markers_on(self, bucket: str, key: str, version: dict[str, Any]) -> list[str]:
        _, markers = self._listing(bucket, key)
        return [m["VersionId"] for m in markers if m["LastModified"] >= version["LastModified"]]

    def _has_marker(self, bucket: str, key: str, marker: str) -> bool:
        _, markers = self._listing(bucket, key)
        return any(m["VersionId"] == marker for m in markers)

    def _tags(self, bucket: str, key: str, version: str) -> list[dict[str, str]]:
        return list(self.s3.get_object_tagging(Bucket=bucket, Key=key,
                                               VersionId=version)["TagSet"])

    def _owner(self, bucket: str, key: str, version: dict[str, Any]) -> str | None:
        return next((t["Value"] for t in self._tags(bucket, key, version["VersionId"])
                     if t["Key"] == OWNER_TAG), None)

    def _tag(self, bucket: str, key: str, version: str, run: str) -> None:
        tags = self._tags(bucket, key, version)
        if len(tags) > MAX_TAGS - len(OURS):
            raise CleanupFailed(f"s3://{bucket}/{key} has {len(tags)} tags: with this run's "
                                f"{len(OURS)} it would have more than S3's {MAX_TAGS}, so it "
                                "cannot be marked as this run's to restore; not deleted")
        self.s3.put_object_tagging(Bucket=bucket, Key=key, VersionId=version, Tagging={
            "TagSet": [*tags, {"Key": OWNER_TAG, "Value": run},
                       {"Key": TOKEN_TAG, "Value": effect_key()}]})

    def _untag(self, bucket: str, key: str, version: str) -> None:
        tags = [t for t in self._tags(bucket, key, version) if t["Key"] not in OURS]
        if tags:
            self.s3.put_object_tagging(Bucket=bucket, Key=key, VersionId=version,
                                       Tagging={"TagSet": tags})
        else:
            self.s3.delete_object_tagging(Bucket=bucket, Key=key, VersionId=version)

    def build(self) -> StateGraph[Any, Any, Any, Any]:
        builder: StateGraph[Any, Any, Any, Any] = StateGraph(CleanupState)
        for node in NODES:
            builder.add_node(node, getattr(self, node))
        for a, b in zip([START, *NODES], [*NODES, END], strict=True):
            builder.add_edge(a, b)
        return builder


_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def _buckets(options: Any, aws: AwsSettings) -> frozenset[str] | None:
    if unknown := set(options) - {"buckets"}:
        raise ConfigurationError(f"agent 'cleanup': unknown options {sorted(unknown)} in "
                                 "STATEGUARD_AGENT_OPTIONS (it takes buckets)")
    buckets = options.get("buckets")
    if buckets is None:  # any bucket of the stand-in; with AWS itself, none until named
        return None if aws.endpoint_url else frozenset()
    if not isinstance(buckets, list) or not all(
            isinstance(b, str) and _BUCKET.match(b) for b in buckets):
        raise ConfigurationError(f"agent 'cleanup': option buckets {buckets!r} is not a list "
                                 "of bucket names")
    return frozenset(buckets)


@register("cleanup", version="1")
def spec(settings: AgentSettings) -> AgentSpec:
    aws = aws_settings(settings, "cleanup")
    agent = Cleaner(aws, buckets=_buckets(settings.options_for("cleanup"), aws))
    return AgentSpec(
        name="cleanup", build=agent.build, input_schema=CleanupInput,
        on_error=cleanup_error_policy,
        # It looks for the version its run tagged before it acts: safe for a step in doubt.
        compensations={"delete_object": Compensation(agent.restore_object, in_doubt_safe=True)},
        description="Delete a file from S3 (versioning on); undone by removing the delete "
                    "marker, which brings back the very version.")
