"""The cleanup agent deletes a file from S3 (moto's server, versioning on), and its compensation
brings back the very version: the same bytes, byte for byte, the same version id, the same
tags. It restores only what its own run deleted, also when its step died after the delete."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from agents.cleanup import Cleaner, CleanupFailed, _buckets
from agents.registry import AwsSettings
from stateguard import SagaAborted
from tests.agents.provision_support import in_memory, ledger, run, undone
from tests.agents.test_provision_ownership import crash, recover
from tests.aws_world import AwsWorld

BUCKET, KEY = "files", "reports/2026/q3.pdf"


def put_file(aws: AwsWorld, *, versioning: bool = True) -> tuple[bytes, str]:
    """A bucket with one file in it (random bytes, a tag of its own): its bytes and version."""
    aws.s3.create_bucket(Bucket=BUCKET)
    if versioning:
        aws.s3.put_bucket_versioning(Bucket=BUCKET,
                                     VersioningConfiguration={"Status": "Enabled"})
    data = os.urandom(70_000) + b"\x00\r\n"  # not text: every byte must come back
    version = aws.s3.put_object(Bucket=BUCKET, Key=KEY, Body=data, Tagging="owner=finance")
    return data, str(version.get("VersionId"))


def current(aws: AwsWorld) -> tuple[bytes, str, list[dict[str, str]]] | None:
    """The file as a reader gets it (bytes, version id, tags), or None when it is gone."""
    try:
        got = aws.s3.get_object(Bucket=BUCKET, Key=KEY)
    except ClientError as exc:
        assert exc.response["Error"]["Code"] == "NoSuchKey"
        return None
    version = got.get("VersionId", "null")  # "null": a bucket that never had versioning
    tags = aws.s3.get_object_tagging(Bucket=BUCKET, Key=KEY, VersionId=version)
    return got["Body"].read(), version, tags["TagSet"]


def markers(aws: AwsWorld) -> int:
    return len(aws.s3.list_object_versions(Bucket=BUCKET, Prefix=KEY).get("DeleteMarkers", []))


def delete(guard: Any, graph: Any, thread: str, **input: Any) -> Any:
    return run(guard, graph, thread, bucket=BUCKET, key=KEY, **input)


def test_an_unwound_delete_brings_back_the_very_file_byte_for_byte(aws: AwsWorld) -> None:
    data, version = put_file(aws)
    guard, graph = in_memory(aws.settings, "cleanup")

    with pytest.raises(SagaAborted) as caught:  # it deleted the file, then failed
        delete(guard, graph, "run-1", fail_at="verify_gone")

    assert undone(caught.value) == [("delete_object", "succeeded")]
    assert current(aws) == (data, version, [{"Key": "owner", "Value": "finance"}])
    assert markers(aws) == 0
    marker = guard.journal.effects("run-1")[0].effect.external_id  # type: ignore[attr-defined]
    assert marker.startswith(f"{BUCKET}@")
    assert ledger(guard, "run-1") == [("delete_marker", "compensated", ""),
                                      ("restore", "compensated", marker)]


def test_an_operator_undoes_a_finished_delete(aws: AwsWorld) -> None:
    data, version = put_file(aws)
    guard, graph = in_memory(aws.settings, "cleanup")
    done = delete(guard, graph, "run-1")
    assert done["gone"] and done["deleted_version"] == version and current(aws) is None

    report = guard.compensate(graph, {"configurable": {"thread_id": "run-1"}})

    assert [(c.node, str(c.status)) for c in report.outcomes] == [
        ("verify_gone", "no_compensation"), ("delete_object", "succeeded")]
    assert current(aws) == (data, version, [{"Key": "owner", "Value": "finance"}])


def test_it_refuses_a_bucket_without_versioning_before_any_effect(aws: AwsWorld) -> None:
    data, _ = put_file(aws, versioning=False)
    guard, graph = in_memory(aws.settings, "cleanup")

    with pytest.raises(SagaAborted) as caught:
        delete(guard, graph, "run-1")

    assert isinstance(caught.value.cause, CleanupFailed)
    assert str(caught.value.cause) == ("versioning is off on bucket files: a delete there "
                                       "could not be undone; turn it on first")
    assert current(aws) == (data, "null", [{"Key": "owner", "Value": "finance"}])
    assert undone(caught.value) == [("delete_object", "nothing_to_undo")]


def test_it_never_brings_back_a_file_someone_else_deleted(aws: AwsWorld) -> None:
    put_file(aws)
    aws.s3.delete_object(Bucket=BUCKET, Key=KEY)  # by hand
    guard, graph = in_memory(aws.settings, "cleanup")

    with pytest.raises(SagaAborted) as caught:
        delete(guard, graph, "run-1")
    assert str(caught.value.cause) == (f"s3://{BUCKET}/{KEY} does not exist (deleted already, "
                                       "or never written)")
    assert undone(caught.value) == [("delete_object", "nothing_to_undo")]
    assert current(aws) is None and markers(aws) == 1

    # Nor one another run deleted: run-2's compensation finds no version of its run's.
    aws.s3.put_object(Bucket=BUCKET, Key=KEY, Body=b"again")
    delete(guard, graph, "run-3")
    cleaner = Cleaner(aws.settings, buckets=None)
    ctx: Any = type("Ctx", (), {"run_id": "run-2"})()
    assert cleaner.restore_object({"bucket": BUCKET, "key": KEY}, ctx) is False
    assert current(aws) is None and markers(aws) == 2


def test_it_leaves_a_file_written_again_since_its_delete(aws: AwsWorld) -> None:
    put_file(aws)
    guard, graph = in_memory(aws.settings, "cleanup")
    delete(guard, graph, "run-1")
    newer = aws.s3.put_object(Bucket=BUCKET, Key=KEY, Body=b"written since")["VersionId"]

    report = guard.compensate(graph, {"configurable": {"thread_id": "run-1"}})

    # Bringing back the old one would overwrite the newer write: it stays current.
    assert [(c.node, str(c.status)) for c in report.outcomes][-1] == (
        "delete_object", "nothing_to_undo")
    assert current(aws) == (b"written since", newer, [])


@pytest.mark.slow
@pytest.mark.parametrize("die_at", ["ledger:delete_marker", "finish:delete_object"])
def test_it_restores_what_a_step_in_doubt_deleted(aws: AwsWorld, tmp_path: Path,
                                                  die_at: str) -> None:
    # The process dies after S3 deleted the file, before the step's result was saved (with
    # "ledger:", before the ledger heard of it too): the tag on the version says it was this
    # run's, and recovery brings it back.
    data, version = put_file(aws)
    crash(tmp_path, "run-1", "", die_at, agent="cleanup", data={"bucket": BUCKET, "key": KEY})
    assert current(aws) is None

    report, effects = recover(tmp_path, "run-1", aws, agent="cleanup")

    assert [(c.node, str(c.status)) for c in report.outcomes] == [
        ("delete_object", "succeeded")]
    assert current(aws) == (data, version, [{"Key": "owner", "Value": "finance"}])
    assert markers(aws) == 0 and [kind for kind, _, _ in effects][-1] == "restore"
    # The marker is in the ledger, undone, also when the step died before recording it: the
    # compensation recorded the marker it found.
    assert [(kind, status) for kind, status, _ in effects] == [
        ("delete_marker", "compensated"), ("restore", "compensated")]


def test_with_aws_itself_it_deletes_from_no_bucket_until_one_is_named() -> None:
    real = AwsSettings(region="eu-west-1", endpoint_url=None, access_key_id=None,
                       secret_access_key=None)
    cleaner = Cleaner(real, buckets=_buckets({}, real))
    with pytest.raises(CleanupFailed, match=r"lets the agent delete from \(none: STATEGUARD"):
        cleaner.delete_object({"bucket": BUCKET, "key": KEY},
                              {"configurable": {"thread_id": "run-1"}})
    assert "s3" not in cleaner.__dict__  # refused before any call
    assert _buckets({"buckets": ["files"]}, real) == {"files"}
