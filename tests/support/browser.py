"""Headless Chromium for the tests that use sluice's page as a user does: Debian's ``chromium`` through
Playwright (which cannot download a browser of its own here), and Airflow's own sign-in form."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    assert Path(chromium).exists(), "Debian's chromium is missing: `make setup` installs it (apt-get install chromium)"
    with sync_playwright() as p:
        # --no-sandbox: Chromium's sandbox refuses to run as root, which CI and these machines are.
        launched = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


def sign_in(browser: Any, url: str, username: str, password: str, **options: Any) -> Any:
    """A new browser context (no cookie) on the ledger page at ``url``: refused, then signed in through
    Airflow's own login form, which comes back to the page. ``page.errors`` collects the page's errors."""
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1400, "height": 1000}, **options)
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.errors = errors
    response = page.goto(f"{url}/sluice/ledger")
    assert response is not None and response.status == 401
    page.get_by_role("link", name="Sign in").click()
    page.locator("input[name=username]").fill(username)
    page.locator("input[name=password]").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{url}/sluice/ledger", timeout=60_000)
    expect(page.locator("body")).to_have_attribute("data-loaded", "true", timeout=60_000)
    return page
