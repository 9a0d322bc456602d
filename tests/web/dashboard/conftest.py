"""Fixtures for the dashboard's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stateguard_web.sagas import events


@pytest.fixture
def publisher(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A live-update publisher of its own, on the channel layer of the settings now (the
    process's one is made once, maybe under another test's layer)."""
    monkeypatch.setattr(events, "_publisher", events._Publisher())
    yield
