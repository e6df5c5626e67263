"""The site as a person sees it: Debian's chromium, headless, opens the pages `spolake view` wrote from disk.

CI installs chromium (scripts/setup.sh), so there these tests must run; elsewhere a missing chromium skips them.
"""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from tests.view.browser import Browser, chromium, require_chromium
from tests.view.conftest import ATTACK, PIVOTAL, cli

pytestmark = pytest.mark.integration
require_chromium()


@pytest.fixture(scope="module")
def site(view_lake) -> Path:
    out = view_lake.root / "site"
    cli(view_lake.lake, "view", "--out", out, "--tokenizer", view_lake.tokenizer, "--runs", view_lake.runs,
        "--quiet")
    return out


@pytest.fixture(scope="module")
def browser():
    b = Browser(chromium() or "")
    yield b
    b.close()


def _page(site: Path, pattern: str) -> Path:
    return next(p for p in sorted(site.rglob("*.html")) if re.search(pattern, p.relative_to(site).as_posix()))


def _text(browser: Browser, selector: str) -> list[str]:
    return browser.eval(f"[...document.querySelectorAll({selector!r})].map(e => e.textContent)")


def test_every_page_renders_without_javascript_errors_or_network(site, browser):
    pages = sorted(site.rglob("*.html"))
    assert len(pages) >= 8
    for path in pages:
        browser.open(path)
        assert browser.errors() == [], path
        assert all(url.startswith("file:") for url in browser.requests()), (path, browser.requests())
        assert browser.eval("document.querySelector('h1').textContent"), path


def test_every_link_and_script_points_to_a_file_of_the_site(site, browser):
    for path in sorted(site.rglob("*.html")):
        browser.open(path)
        for url in browser.eval("[...document.querySelectorAll('[href],[src]')].map(e => e.href || e.src)"):
            target = Path(unquote(urlparse(url).path))
            assert target.is_file(), (path, url)
            assert target.resolve().is_relative_to(site.resolve()), (path, url)


def test_the_overview_shows_rows_snapshots_runs_and_the_report_views(site, browser):
    browser.open(site / "index.html")
    cells = _text(browser, "td")
    for value in ("policy", "grpo", "human", "countdown", "ok", "wrong_answer", "v1", "before <the> later rollout",
                  "run-a", "train", "finished", "cd/mul"):
        assert value in cells, value
    headings = " ".join(_text(browser, "h2"))
    for title in ("Coverage", "First solved", "Hardest", "Snapshots", "Runs"):
        assert title in headings
    assert browser.eval("document.querySelectorAll('#verdicts .main-svg').length") > 0  # plotly drew the chart


def test_pivotal_tokens_are_highlighted_on_their_characters(site, browser, view_lake):
    browser.open(_page(site, r"prompts/cd_mul-[0-9a-f]+\.html"))
    marks = browser.eval("""[...document.querySelectorAll('mark.pivot')].map(m => ({
        text: m.textContent, title: m.title, before: (() => { const r = document.createRange();
            r.setStart(m.closest('pre'), 0); r.setEndBefore(m); return r.toString(); })(),
        response: m.closest('pre').textContent, color: getComputedStyle(m).backgroundColor}))""")
    assert [m["text"] for m in marks] == [p["text"] for p in view_lake.pivots]
    for mark, pivot in zip(marks, view_lake.pivots):
        assert mark["response"] == PIVOTAL[1]
        assert PIVOTAL[1][len(mark["before"]):].startswith(mark["text"])  # the mark sits where its token is
        assert f"{pivot['s_before']:.3f} → {pivot['s_after']:.3f}" in mark["title"]
    assert marks[0]["color"].startswith("rgba(22, 163, 74") and marks[1]["color"].startswith("rgba(220, 38, 38")
    assert marks[2]["text"] == "" and marks[2]["before"] == PIVOTAL[1]  # EOS: an empty mark after the last character


def test_a_prompt_page_shows_problem_tests_q0_and_every_trajectory_by_source_and_run(site, browser):
    browser.open(_page(site, r"prompts/cd_mul-[0-9a-f]+\.html"))
    assert "Reach 56 with [7, 8] <b>bold?</b>" in _text(browser, "pre.problem")
    assert '"target": 56' in _text(browser, "pre.tests")[0]
    groups = _text(browser, "section.group h3")
    assert [g.split(" (")[0] for g in groups] == ["grpo · run-b", "human · no run", "policy · run-a"]
    assert len(_text(browser, "div.trajectory")) == 5
    meta = " ".join(_text(browser, "p.meta"))
    assert "policy version 1" in meta and "reward -1" in meta and "verifier countdown" in meta
    assert meta.count("Q̂0 0.25") == 5
    assert "0.25" in _text(browser, "td")  # Q̂0: 5 of 20


def test_two_runs_answers_side_by_side(site, browser):
    browser.open(_page(site, r"prompts/cd_mul-[0-9a-f]+\.html"))
    shown = "[...document.querySelectorAll('#compare-b div.group:not([hidden]) pre')].map(e => e.textContent)"
    before = browser.eval(shown)
    browser.eval("""const s = document.querySelector('#compare-b select');
                    s.value = [...s.options].find(o => o.text.startsWith('policy')).value;
                    s.dispatchEvent(new Event('change'))""")
    after = browser.eval(shown)
    assert before != after and sorted(after) == ["7 * 8", "7 + 8"]


def test_an_attackers_response_shows_as_text_and_runs_nothing(site, browser):
    browser.open(_page(site, r"prompts/cd_mul-[0-9a-f]+\.html"))
    assert browser.eval("document.title") == "Prompt cd/mul"
    assert browser.eval("typeof window.pwned") == "undefined"
    assert browser.eval("document.querySelectorAll('img, svg:not(.main-svg), pre script').length") == 0
    assert ATTACK in _text(browser, "div.trajectory pre.response")
    browser.open(_page(site, r"runs/run-a-"))  # the run's config carries a </script> too
    assert browser.eval("typeof window.pwned") == "undefined" and browser.errors() == []


def test_a_run_page_charts_pass_at_k_from_step_0_and_the_training_curves(site, browser):
    browser.open(_page(site, r"runs/run-a-"))
    charts = browser.eval("[...document.querySelectorAll('div.chart')].map(d => [d.id, d._fullData ? "
                          "d._fullData.map(t => [t.name, t.x[0], t.x.length]) : null])")
    assert dict(charts)["passk"] == [["pass@1", 0, 2], ["pass@10", 0, 2]]
    assert {c for c, _ in charts} >= {"curve-loss", "curve-kl", "curve-grad_norm"}
    assert dict(charts)["curve-loss"] == [["loss", 1, 8]]
    assert dict(charts)["curve-rollouts"] == [["passed", 0, 2]]  # run-a's rollouts at policy versions 0 and 1
    cells = _text(browser, "td")
    assert "finished" in cells and "v1" in cells and "cd/mul" in cells  # its rollouts, by prompt


def test_a_snapshot_site_shows_the_lake_as_it_was(view_lake, browser):
    out = view_lake.root / "site-v1"
    cli(view_lake.lake, "view", "--out", out, "--snapshot", "v1", "--quiet")
    browser.open(_page(out, r"prompts/cd_add-[0-9a-f]+\.html"))
    assert len(_text(browser, "div.trajectory")) == 1  # the later rollout is not in v1
    browser.open(out / "index.html")
    assert "snapshot v1" in browser.eval("document.body.textContent")


def test_the_demos_report_is_linked_with_its_plots(view_lake, browser, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.plot([0, 1], [0, 1])
    plt.savefig(tmp_path / "pass_at_k.png")
    plt.close()
    (tmp_path / "secret.png").write_bytes((tmp_path / "pass_at_k.png").read_bytes())
    report = tmp_path / "demo" / "report.md"
    report.parent.mkdir()
    (report.parent / "pass_at_k.png").write_bytes((tmp_path / "pass_at_k.png").read_bytes())
    tid = view_lake.pivots[0]["trajectory_id"]
    report.write_text("# demo\n<script>window.pwned = 5</script>\n![pass@k](pass_at_k.png)\n![x](../secret.png)\n"
                      f"held-out: cd/mul, cd/add. Run run-a. PTS curve of trajectory `{tid}`.\n")
    out = view_lake.root / "site-demo"
    cli(view_lake.lake, "view", "--out", out, "--demo-report", report, "--quiet")
    browser.open(out / "index.html")
    assert browser.eval("document.querySelector('a[href=\"demo.html\"]').textContent") == "The demo's report"
    browser.open(out / "demo.html")
    assert "<script>window.pwned = 5</script>" in _text(browser, "pre.report")[0]
    assert browser.eval("typeof window.pwned") == "undefined" and browser.errors() == []
    assert browser.eval("[...document.images].map(i => [i.alt, i.naturalWidth > 0])") == [["pass_at_k.png", True]]
    assert not any(out.rglob("secret.png"))
    links = browser.eval("[...document.querySelectorAll('pre.report a')].map(a => [a.textContent, a.href])")
    assert [text for text, _ in links] == ["cd/mul", "cd/add", "run-a", tid]
    for text, url in links:
        target = urlparse(url)
        assert Path(unquote(target.path)).is_file()
        if text == tid:  # the trajectory's own block on its prompt's page
            browser.open(Path(unquote(target.path)))
            assert browser.eval(f"document.getElementById({unquote(target.fragment)!r}).textContent").find(
                PIVOTAL[1]) >= 0


def test_long_listings_are_paginated_and_every_page_links_resolve(view_lake, browser, tmp_path):
    from spo_lake.lake import Lake
    from spo_lake.view.data import Limits
    from spo_lake.view.site import build_site

    out = tmp_path / "paged"
    build_site(Lake.open(view_lake.lake), out, limits=Limits(trajectories_per_page=2, prompts_per_page=2),
               show_progress=False)
    capped = tmp_path / "capped"
    build_site(Lake.open(view_lake.lake), capped, limits=Limits(trajectories_per_prompt=4), show_progress=False)
    browser.open(_page(capped, r"prompts/cd_mul-[0-9a-f]+\.html"))
    assert len(_text(browser, "div.trajectory")) == 4
    assert "5 trajectories (its pages show the first 4" in browser.eval("document.body.textContent")
    mul = sorted(p.name for p in (out / "prompts").glob("cd_mul-*.html"))
    assert len(mul) == 3 and len(sorted((out / "prompts").glob("index*.html"))) == 2  # 5 rollouts, 3 prompts
    shown = []
    for name in mul:
        browser.open(out / "prompts" / name)
        shown += _text(browser, "div.trajectory code")
        assert browser.errors() == []
        for url in browser.eval("[...document.querySelectorAll('p.pager a')].map(a => a.href)"):
            assert Path(unquote(urlparse(url).path)).is_file()
    assert len(shown) == len(set(shown)) == 5  # each trajectory on exactly one page

