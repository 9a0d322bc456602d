"""Fixtures for the dashboard's tests, the browser's among them: ``browser`` is Debian's
Chromium (Playwright; ``playwright install`` cannot download here), watched for what must not
happen on any page."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stateguard_web.sagas import events
from tests.web.conftest import ROOT

# Screenshots of every page (not committed, but the run page's in docs/img/).
ARTIFACTS = Path(os.environ.get("STATEGUARD_ARTIFACTS") or ROOT / "var" / "test-artifacts") \
    / "dashboard"
# Debian's Chromium, told not to call out to the network (the machine's network is closed).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-quic"]


@pytest.fixture
def publisher(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A live-update publisher of its own, on the channel layer of the settings now (the
    process's one is made once, maybe under another test's layer)."""
    monkeypatch.setattr(events, "_publisher", events._Publisher())
    yield


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("Debian's chromium is missing: apt-get install -y chromium (.ci/run does)")
    # Playwright's sync API runs an event loop in this thread: Django's ORM, used here to make
    # users and submit runs, would take it for async code: Django refuses that unless told.
    saved = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=executable, headless=True,
                                                  args=CHROMIUM_ARGS)
            yield chromium
            chromium.close()
    finally:
        if saved is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = saved


class Watched:
    """Chromium, whose every context reports what must not happen on a page: a violation of
    the Content-Security-Policy (Chromium says so on the console), an error the page's script
    throws, a request of its answered 404 (a missing script or stylesheet, say)."""

    def __init__(self, chromium: Any) -> None:
        self.chromium = chromium
        self.problems: list[str] = []

    def new_context(self, **options: Any) -> Any:
        context = self.chromium.new_context(**options)
        context.on("console", self._console)
        context.on("weberror", lambda error: self.problems.append(f"script error: {error.error}"))
        context.on("response", self._response)
        return context

    def _console(self, message: Any) -> None:
        if "Content Security Policy" in message.text:
            self.problems.append(f"CSP violation on {message.page.url}: {message.text}")

    def _response(self, response: Any) -> None:
        if response.status == 404:
            self.problems.append(f"404: {response.url}")


@pytest.fixture
def browser(chromium: Any) -> Iterator[Watched]:
    watched = Watched(chromium)
    yield watched
    assert not watched.problems, "\n".join(watched.problems)
