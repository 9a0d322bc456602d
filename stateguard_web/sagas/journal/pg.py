"""Connection parameters for psycopg from Django's settings (the LangGraph saver's own
connections). Kept apart from the app's modules so that migrations can import it."""

from __future__ import annotations

from typing import Any


def conninfo(db: dict[str, Any]) -> str:
    import psycopg

    return psycopg.conninfo.make_conninfo(
        dbname=db["NAME"], user=db.get("USER") or None, password=db.get("PASSWORD") or None,
        host=db.get("HOST") or None, port=db.get("PORT") or None)
