"""AWS for the agents: boto3 clients made from the deployment's ``AwsSettings``, and the tags
that say which run owns a resource.

Every resource an agent makes carries its run's id (``stateguard:run``) from the request that
makes it (``TagSpecifications``: there is no moment when it exists untagged), and is found
again by that tag: a compensation removes only what carries its own run's tag, and finds it
even when the step that made it died before its result was saved (the step is in doubt).

The clients never retry a request on their own (``total_max_attempts=1``): an answer lost to a
timeout is looked up by its tag (the step's next attempt and every compensation do), never sent
again blindly, which for a call with no idempotency token (``AllocateAddress``) would make a
second resource. A step whose call failed without a verdict (``aws_unsure``) is run again
(``AWS_STEP_RETRY``), lookup first.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError, HTTPClientError, WaiterError
from botocore.exceptions import ConnectionError as AwsConnectionError
from botocore.parsers import ResponseParserError

from agents.registry import AgentSettings, AwsSettings
from stateguard import CompensationRetry, ConfigurationError

RUN_TAG = "stateguard:run"  # the run that made the resource: its owner
NAME_TAG = "stateguard:name"  # the name the run was asked for ("web-1")
TOKEN_TAG = "stateguard:token"  # the step's idempotency key: which step made it


def aws_settings(settings: AgentSettings, agent: str) -> AwsSettings:
    """The deployment's AWS settings, or a clear refusal to build ``agent`` without them."""
    if settings.aws is None:
        raise ConfigurationError(
            f"agent {agent!r} calls AWS, and this deployment gives it no AWS settings "
            "(AgentSettings.aws; the web app builds them from AWS_ENDPOINT_URL, AWS_REGION and "
            "the AWS keys: docs/deploy.md)")
    return settings.aws


@lru_cache(maxsize=32)
def client(aws: AwsSettings, service: str) -> Any:
    """A boto3 client for ``service``, with only what ``aws`` says: the endpoint and keys that
    the environment or ``~/.aws`` may name are not read (the deployment's settings are the
    one place for them), but the keys fall back to boto3's chain when ``aws`` has none.

    One per settings and service in a process: making one reads the service's model (half a
    second for EC2's), and a client may be shared by threads (boto3's documentation)."""
    session = boto3.session.Session(aws_access_key_id=aws.access_key_id,
                                    aws_secret_access_key=aws.secret_access_key,
                                    region_name=aws.region)
    config = Config(retries={"mode": "standard", "total_max_attempts": 1},
                    connect_timeout=5, read_timeout=60, ignore_configured_endpoint_urls=True,
                    # A local stand-in has no bucket.host names: the bucket goes in the path.
                    s3={"addressing_style": "path" if aws.endpoint_url else "auto"})
    return session.client(service, endpoint_url=aws.endpoint_url, config=config)


def tags(resource_type: str, **values: str) -> list[dict[str, Any]]:
    """``TagSpecifications`` for one resource of ``resource_type``: ``run=`` becomes
    ``stateguard:run`` and so on, ``Name`` is the console's name."""
    keys = {"run": RUN_TAG, "name": NAME_TAG, "token": TOKEN_TAG, "Name": "Name"}
    return [{"ResourceType": resource_type,
             "Tags": [{"Key": keys[k], "Value": v} for k, v in values.items()]}]


def tag_filters(**values: str) -> list[dict[str, Any]]:
    """``Filters`` for the resources tagged so (``run=``, ``name=``, ``token=``)."""
    keys = {"run": RUN_TAG, "name": NAME_TAG, "token": TOKEN_TAG}
    return [{"Name": f"tag:{keys[k]}", "Values": [v]} for k, v in values.items()]


def tag_of(resource: dict[str, Any], key: str) -> str | None:
    return next((t["Value"] for t in resource.get("Tags") or [] if t["Key"] == key), None)


def error_code(exc: BaseException) -> str:
    """The AWS error code of a failed call ("InvalidGroup.Duplicate"), "" for any other error."""
    return error_code_of(exc.response) if isinstance(exc, ClientError) else ""


# Error codes AWS answers when it asks a caller to slow down: nothing was done.
_THROTTLED = frozenset({"Throttling", "ThrottlingException", "RequestLimitExceeded",
                        "TooManyRequestsException", "PriorRequestNotComplete"})


def aws_unsure(exc: BaseException) -> bool:
    """Whether an AWS call failed without a verdict, so another attempt may succeed: AWS out
    of reach, the connection cut or timed out before its answer (the request may or may not
    have been acted on), an answer that is no AWS document (a proxy's error page), a 5xx, or
    throttled; also a waiter stopped by one of those. Not an error AWS answered about the
    request itself (a 4xx: a name taken, a bad AMI)."""
    if isinstance(exc, (HTTPClientError, AwsConnectionError, ResponseParserError)):
        return True
    if isinstance(exc, ClientError):
        response: Any = exc.response
    elif isinstance(exc, WaiterError):
        response = exc.last_response
    else:
        return False
    status = (response or {}).get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
    return int(status) >= 500 or error_code_of(response) in _THROTTLED


def error_code_of(response: Any) -> str:
    return str(((response or {}).get("Error") or {}).get("Code", ""))


# How a step whose AWS call failed without a verdict is run again: about 10 s of attempts, each
# starting with the step's lookup of what an earlier attempt made (agents/provision.py).
AWS_STEP_RETRY = CompensationRetry(attempts=6, initial=0.5, cap=4.0,
                                   permanent=lambda exc: not aws_unsure(exc))
