"""Screenshots of a site for the docs (docs/images/viewer-*.png), in the same headless Chromium the tests use:

    python -m tests.view.screenshots demo-out/site docs/images

the overview, the prompt page with the most pivotal tokens (scrolled to the first), and the training run's page with
the most charts.
"""
from __future__ import annotations

import sys
from pathlib import Path

from tests.view.browser import Browser, chromium


def main(site: Path, out: Path) -> None:
    prompts = sorted(site.glob("prompts/*.html"), key=lambda p: -p.read_text().count('<mark class="pivot'))
    runs = sorted((p for p in site.glob("runs/*.html") if "<td>train</td>" in p.read_text()),
                  key=lambda p: (-p.read_text().count('class="chart"'), p.name))
    browser = Browser(chromium() or "chromium")
    try:
        for name, page, focus in (("overview", site / "index.html", None),
                                  ("prompt", prompts[0], "mark.pivot"), ("run", runs[0], None)):
            browser.open(page)
            if focus:
                browser.eval(f"document.querySelector({focus!r}).closest('.trajectory')"
                             ".scrollIntoView({block: 'center'})")
            browser.screenshot(out / f"viewer-{name}.png")
            print(f"{out / f'viewer-{name}.png'}: {page.relative_to(site)}, errors: {browser.errors()}")
    finally:
        browser.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
