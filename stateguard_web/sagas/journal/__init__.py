"""The saga journal on the Django database: the core's ``Journal`` protocol over the models
(``django_journal``) and its PostgreSQL machinery: the fence and the step rows that travel in
LangGraph's checkpoint writes (``step_rows``, ``checkpoints``), and psycopg connection
parameters (``pg``, importable by migrations)."""

from __future__ import annotations

from stateguard_web.sagas.journal.django_journal import DjangoJournal, LeaseLost, is_fenced_out

__all__ = ["DjangoJournal", "LeaseLost", "is_fenced_out"]
