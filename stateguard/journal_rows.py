"""Rows of the SQL journals (``SqliteJournal``, ``PostgresJournal``) as records, and values as
the JSON they store. Both select a run's, a step's and an effect's columns in the order these
read them (each journal's ``_RUN_COLUMNS``, ``_STEP_COLUMNS``, ``_EFFECT_COLUMNS``)."""

from __future__ import annotations

import json
from typing import Any

from stateguard.effects import Effect, EffectRecord, EffectStatus
from stateguard.records import (
    ErrorInfo,
    RunRecord,
    RunStatus,
    StepRecord,
    StepStatus,
    json_default,
)


def dumps(value: Any) -> str | None:
    """A state, an update or a payload as JSON (what JSON cannot hold as its ``repr``)."""
    return None if value is None else json.dumps(value, default=json_default)


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def error_json(error: ErrorInfo | None) -> str | None:
    return None if error is None else json.dumps(error.to_dict())


def error_from(text: str | None) -> ErrorInfo | None:
    return ErrorInfo.from_dict(loads(text))


def run_from(r: tuple[Any, ...]) -> RunRecord:
    """run_id, status, error, lock_owner, lock_expires (NULL: none), created_at, updated_at,
    turn, fencing_token."""
    return RunRecord(r[0], RunStatus(r[1]), error_from(r[2]), r[3], r[4] or 0.0, r[5], r[6],
                     r[7], r[8])


def step_from(run_id: str, r: tuple[Any, ...]) -> StepRecord:
    """step_id, node, tags (a JSON list, or a list), status, attempt, started_at, finished_at,
    done_seq, update, state_after, error, turn, kind."""
    tags = json.loads(r[2]) if isinstance(r[2], str) else r[2]
    return StepRecord(run_id, r[0], r[1], tuple(tags), StepStatus(r[3]), r[4], r[5], r[6], r[7],
                      loads(r[8]), loads(r[9]), error_from(r[10]), r[11], r[12])


def effect_from(r: tuple[Any, ...]) -> EffectRecord:
    """run_id, step_id, node, provider, kind, external_id, amount, currency, idempotency_key,
    undoes, status, recorded_at."""
    return EffectRecord(r[0], r[1], r[2], Effect(r[3], r[4], r[5], r[6], r[7], r[8], r[9]),
                        EffectStatus(r[10]), r[11])
