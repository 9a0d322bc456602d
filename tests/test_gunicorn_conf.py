"""gunicorn.conf.py's own switch: the access log, on unless STATEGUARD_ACCESS_LOG=off (behind the
proxy, whose log is the access log: docs/deploy.md); anything else stops gunicorn with a reason."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

CONF = str(Path(__file__).resolve().parent.parent / "gunicorn.conf.py")


@pytest.mark.parametrize(("value", "accesslog"), [
    (None, "-"), ("on", "-"), ("off", None), (" OFF ", None)])
def test_the_access_log_is_on_unless_turned_off(monkeypatch: pytest.MonkeyPatch,
                                                value: str | None, accesslog: str | None) -> None:
    if value is None:
        monkeypatch.delenv("STATEGUARD_ACCESS_LOG", raising=False)
    else:
        monkeypatch.setenv("STATEGUARD_ACCESS_LOG", value)
    assert runpy.run_path(CONF)["accesslog"] == accesslog


def test_a_bad_value_stops_gunicorn_with_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATEGUARD_ACCESS_LOG", "false")
    with pytest.raises(SystemExit, match="STATEGUARD_ACCESS_LOG must be 'on' or 'off'"):
        runpy.run_path(CONF)


def test_each_process_leaves_what_it_started_with_out_of_the_collectors_counts() -> None:
    import gc

    before = gc.get_freeze_count()
    try:
        runpy.run_path(CONF)["post_worker_init"](object())
        assert gc.get_freeze_count() > before
    finally:
        gc.unfreeze()
