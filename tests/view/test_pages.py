"""The viewer's pure parts and its edges, without a browser (fast tier)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spo_lake.cli.app import app
from spo_lake.errors import InputError
from spo_lake.view.data import run_directory
from spo_lake.view.html import json_script, slug
from spo_lake.view.pages import highlight, prompt_page, run_page
from spo_lake.view.records import Pivot, Prompt, Run, RunDetail, Trajectory
from spo_lake.view.site import prepare


def test_highlight_marks_exactly_the_pivots_characters_and_escapes_the_rest():
    text = "x <b> * y"
    marked = highlight(text, [Pivot(1, 5, 0.2, 0.9, start=6, end=7), Pivot(2, 6, 0.9, 0.5, start=2, end=5)])
    assert re.findall(r"<mark[^>]*>(.*?)</mark>", marked) == ["&lt;b&gt;", "*"]
    assert re.sub(r"<[^>]+>", "", marked) == "x &lt;b&gt; * y"  # nothing lost or moved
    assert 'data-delta="0.7000"' in marked and "Δ +0.700" in marked and "Δ -0.400" in marked


def test_highlight_skips_spans_it_cannot_place_rather_than_marking_wrong_characters():
    text = "abcdef"
    pivots = [Pivot(0, 1, 0.0, 1.0, start=1, end=3), Pivot(1, 1, 0.0, 1.0, start=2, end=4),  # overlaps the first
              Pivot(2, 1, 0.0, 1.0, start=5, end=9), Pivot(3, 1, 0.0, 1.0)]  # past the end; unplaced
    assert re.findall(r"<mark[^>]*>(.*?)</mark>", highlight(text, pivots)) == ["bc"]


def test_json_in_a_script_block_cannot_close_it():
    block = json_script("d", {"text": "</script><script>alert(1)</script> & <!--"})
    inner = block.split(">", 1)[1].rsplit("</script>", 1)[0]
    assert "<" not in inner and ">" not in inner
    assert json.loads(inner) == {"text": "</script><script>alert(1)</script> & <!--"}


def test_slugs_are_safe_file_names_and_never_shared():
    assert slug("a/b") != slug("a_b")
    assert re.fullmatch(r"[A-Za-z0-9_-]+", slug("../../etc/passwd <x>"))


def test_run_directories_are_looked_up_only_inside_the_roots(tmp_path):
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    roots = [tmp_path / "runs"]
    assert run_directory("r1", roots) == tmp_path / "runs" / "r1"
    for bad in ("../outside", "..", ".", "r1/..", "", str(tmp_path / "outside")):
        assert run_directory(bad, roots) is None


def test_the_site_is_never_written_over_a_directory_it_did_not_write(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    with pytest.raises(InputError, match="not a site"):
        prepare(tmp_path / "mine")
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "precious"
    prepare(tmp_path / "site")
    (tmp_path / "site" / "index.html").write_text("old")
    prepare(tmp_path / "site")  # an earlier site is cleared
    assert not (tmp_path / "site" / "index.html").exists()


@pytest.mark.parametrize("args, named", [(["--snapshot", "nope"], "nope"), (["--tokenizer", "no-model"], "no-model"),
                                         (["--demo-report", "no-report.md"], "no-report.md")])
def test_bad_options_are_one_line_errors_and_write_nothing(tmp_path, args, named):
    runner = CliRunner()
    lake = tmp_path / "lake"
    assert runner.invoke(app, ["--lake", str(lake), "init"]).exit_code == 0
    result = runner.invoke(app, ["--lake", str(lake), "view", "--out", str(tmp_path / "site"), *args])
    assert result.exit_code != 0
    assert named in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not Path(tmp_path / "site").exists()


def test_a_pivot_on_a_token_with_no_text_is_an_empty_mark_where_it_stands():
    marked = highlight("1 + 2", [Pivot(3, 2, 0.5, 1.0, start=5, end=5)])
    assert marked.startswith("1 + 2<mark class=\"pivot silent\"") and marked.endswith("></mark>")


EVIL = '</pre></script><script>alert(1)</script><img src=x onerror="alert(2)">\'"&'


def _markup(page: str) -> list[tuple[str, list[str]]]:
    """Every element the page holds, with its attribute names, as a browser's parser reads them."""
    from html.parser import HTMLParser

    found: list[tuple[str, list[str]]] = []

    class Elements(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.append((tag, [name for name, _ in attrs]))

    Elements().feed(page)
    return found


def test_every_field_a_lake_gives_a_page_is_text():
    """The same pages with harmless values and with an attacker's in every field hold exactly the same elements and
    attributes: nothing a lake holds becomes markup."""
    def pages(text: str) -> list[str]:
        prompt = Prompt(text, text, text, json.dumps({"x": text}), json.dumps({"tag": text}),
                        q0=[{"model_id": text, "n": 4, "n_success": 1}], trajectories=2)
        ts = [Trajectory(f"{text}{i}", f"{text}{i}", text, text, 1, text, text, len(text), text, -1.0, text, text,
                         (Pivot(0, 1, 0.2, 0.9, start=0, end=2),)) for i in range(2)]  # two sources: side by side
        run = Run(text, text, text, text, json.dumps({"note": text}), json.dumps({"m": text}), text, 2)
        detail = RunDetail(run, [{"step": 0, "pass@1": 0.5, text: 1.0}], [{"stream": text}],
                           [{"policy_version": 0, "source": text, "verdict": "ok", "rollouts": 2}],
                           [{"prompt_id": text, "rollouts": 2, "passed": 1}], [text])
        return [prompt_page(prompt, ts, 0, 1, {text}, 2), run_page(detail, {text})]

    for plain, evil in zip(pages("plain"), pages(EVIL)):
        assert _markup(evil) == _markup(plain)


def test_the_demos_report_links_the_ids_it_names_and_nothing_else():
    from spo_lake.view.pages import linked

    links = {"countdown/1/7": "prompts/p.html", "run-a": "runs/r.html"}
    assert linked("held-out countdown/1/7, run-a. <b>run-ab</b>", links) == (
        'held-out <a href="prompts/p.html">countdown/1/7</a>, <a href="runs/r.html">run-a</a>. '
        "&lt;b&gt;run-ab&lt;/b&gt;")


def test_an_empty_lake_has_a_site_too(tmp_path):
    from spo_lake.lake import Lake
    from spo_lake.view.site import build_site

    summary = build_site(Lake.init(tmp_path / "lake"), tmp_path / "site", show_progress=False)
    assert (summary.prompts, summary.trajectories, summary.runs) == (0, 0, 0)
    index = (tmp_path / "site" / "index.html").read_text()
    assert "0 trajectories of 0" in index and (tmp_path / "site" / "prompts" / "index.html").is_file()
    assert (tmp_path / "site" / "assets" / "plotly.min.js").stat().st_size > 1_000_000  # bundled, once
