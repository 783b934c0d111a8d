"""Pages of the trail viewer in a real browser (the ``browser`` fixture: Debian's
Chromium, driven by Playwright), signed in with an API key."""

from __future__ import annotations

from playwright.async_api import Browser, Page, expect

from tests.support import ROOT
from tests.support.stack import InProcessStack

DOCS = ROOT / "docs"
"""Where the screenshots go (the README shows them)."""


async def signed_in(browser: Browser, stack: InProcessStack, key: str, path: str = "/ui/",
                    width: int = 1280) -> Page:
    """A new page of ``path``, signed in with ``key``; it records every URL it requests."""
    page = await browser.new_page(viewport={"width": width, "height": 900})
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.requested = requested  # type: ignore[attr-defined]
    await page.goto(stack.base_url + path)
    await page.get_by_label("API key").fill(key)
    await page.get_by_role("button", name="Sign in").click()
    return page


async def shown_in_full(page: Page) -> None:
    """Waits until the page asked for last is shown: until then the previous one stays
    on screen, marked busy."""
    await expect(page.locator("main")).not_to_have_attribute("aria-busy", "true")


def never_in_a_url(page: Page, key: str) -> None:
    requested: list[str] = page.requested  # type: ignore[attr-defined]
    assert requested and not [url for url in requested if key in url or "ct_" in url]


FLAWS = ("[object ", "undefined", "NaN")
"""What a page shows when a value was rendered wrong (an element stringified, a missing
field, a number from nothing)."""


async def no_flaws(page: Page) -> None:
    """The page as a person reads it holds none of ``FLAWS``."""
    text = await page.locator("body").inner_text()
    found = [flaw for flaw in FLAWS if flaw in text]
    assert not found, f"{page.url} shows {found}"
