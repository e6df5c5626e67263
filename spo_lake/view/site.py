"""`spolake view`: write the static site of a lake (or one snapshot of it) into a directory.

The site opens from disk with no server and no network: every page is a file, plotly.js is copied once from the
`plotly` package into assets/, and pages link each other by relative paths.

    index.html                  the overview: rows by source × task × verdict, snapshots, runs, report views
    prompts/index[-N].html      every prompt, paginated
    prompts/<prompt>[-N].html   a prompt: problem, tests, Q̂0, its trajectories (paginated), side by side
    runs/index.html, runs/<run>.html
    demo.html                   the demo's report (--demo-report), its ids linked to their pages
    assets/                     plotly.min.js, site.css, site.js (and demo/: the report's plots)
"""
from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from spo_lake.console import progress_bar
from spo_lake.errors import InputError
from spo_lake.lake import Lake
from spo_lake.view import data, pages
from spo_lake.view.data import LIMITS, Limits
from spo_lake.view.html import name_at
from spo_lake.view.records import Prompt, Trajectory

ASSETS = Path(__file__).parent / "assets"
MARKER = ".spolake-view"  # marks a directory this command wrote, so a rebuild may clear it and nothing else


@dataclass(frozen=True)
class SiteSummary:
    out: Path
    pages: int
    prompts: int
    trajectories: int
    runs: int
    largest_page_bytes: int


def prepare(out: Path) -> None:
    """An empty directory for the site: a new one, an empty one, or one an earlier build wrote (cleared)."""
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: a file is there; the site is a directory")
    if out.is_dir() and any(out.iterdir()):
        if not (out / MARKER).is_file():
            raise InputError(f"--out {out}: not empty and not a site `spolake view` wrote; choose another directory")
        shutil.rmtree(out)
    for sub in ("assets", "prompts", "runs"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by spolake view; the next build clears this directory\n")


def copy_assets(out: Path) -> None:
    from plotly.offline import get_plotlyjs

    (out / "assets" / "plotly.min.js").write_text(get_plotlyjs(), encoding="utf-8")
    for name in ("site.css", "site.js"):
        shutil.copyfile(ASSETS / name, out / "assets" / name)


def build_site(lake: Lake, out: Path, snapshot: str | None = None, tokenizer: Path | None = None,
               runs_roots: tuple[Path, ...] = (), demo_report: Path | None = None, limits: Limits = LIMITS,
               show_progress: bool = True) -> SiteSummary:
    """Write the site of `lake` at `snapshot` (default: the head) into `out`. `tokenizer`: π0's model directory,
    to place pivotal tokens on their characters; `runs_roots`: where run directories (metrics.jsonl) live;
    `demo_report`: the demo's report.md, copied in and linked from the overview."""
    if snapshot is not None:
        lake.get_snapshot(snapshot)  # a LakeError naming the snapshot before anything is written
    if demo_report is not None and not demo_report.is_file():
        raise InputError(f"--demo-report {demo_report}: no such file")
    if tokenizer is not None:
        data.require_tokenizer(tokenizer)
    prepare(out)
    copy_assets(out)
    sizes: list[int] = []

    def write(path: str, text: str) -> None:
        encoded = text.encode("utf-8")
        (out / path).write_bytes(encoded)
        sizes.append(len(encoded))

    title = f"Lake {Path(lake.root).name}" + (f" at {snapshot}" if snapshot else "")
    overview = data.overview(lake, snapshot, title)
    if demo_report is not None:
        overview = replace(overview, demo_report="demo.html")
    runs = overview.runs
    known_runs = {r.run_id for r in runs}
    prompts = data.prompts(lake, snapshot)
    known_prompts = set(prompts)
    write("index.html", pages.overview_page(overview, known_prompts, known_runs))
    write("runs/index.html", pages.runs_index_page(runs, known_runs))

    summaries = data.prompt_summaries(lake, snapshot)
    per = limits.prompts_per_page
    listing = max(1, -(-len(summaries) // per))
    for i in range(listing):
        write("prompts/" + name_at("index", i),
              pages.prompts_index_page(summaries[i * per:(i + 1) * per], i, listing, len(summaries)))

    pivots = data.pivots(lake, snapshot, tokenizer)
    anchors: dict[str, str] = {}  # trajectory id -> where it is shown (the demo's report links to it)
    total = 0
    with progress_bar(disable=not show_progress) as bar:
        task = bar.add_task("prompt pages", total=len(prompts))
        seen = set()
        for pid, trajectories in data.trajectories_by_prompt(lake, snapshot, limits, pivots):
            seen.add(pid)
            total += len(trajectories)
            _prompt_pages(write, prompts[pid], trajectories, limits, known_runs, anchors)
            bar.advance(task)
        for pid in known_prompts - seen:  # prompts nothing answered yet
            _prompt_pages(write, prompts[pid], [], limits, known_runs, anchors)
            bar.advance(task)
        task = bar.add_task("run pages", total=len(runs))
        rows = data.run_rows(lake, snapshot)
        for run in runs:
            write(pages.run_href(run.run_id), pages.run_page(data.run_detail(lake, run, rows, runs_roots),
                                                             known_prompts))
            bar.advance(task)
    if demo_report is not None:
        links = {**anchors, **{pid: pages.prompt_href(pid) for pid in known_prompts},
                 **{rid: pages.run_href(rid) for rid in known_runs}}
        write("demo.html", pages.demo_page(*_demo_report(demo_report, out / "assets" / "demo"), links))
    return SiteSummary(out=out, pages=len(sizes), prompts=len(prompts), trajectories=total, runs=len(runs),
                       largest_page_bytes=max(sizes))


def _prompt_pages(write: Callable[[str, str], None], prompt: Prompt, trajectories: Sequence[Trajectory],
                  limits: Limits, known_runs: set[str], anchors: dict[str, str]) -> None:
    per = limits.trajectories_per_page
    count = max(1, -(-len(trajectories) // per))
    for i in range(count):
        shown = trajectories[i * per:(i + 1) * per]
        write(pages.prompt_href(prompt.prompt_id, i),
              pages.prompt_page(prompt, shown, i, count, known_runs, len(trajectories)))
        anchors.update((t.trajectory_id, f"{pages.prompt_href(prompt.prompt_id, i)}#t-{t.trajectory_id}")
                       for t in shown)


def _demo_report(report: Path, into: Path) -> tuple[str, list[str]]:
    """The report's text, and the PNG plots it names that lie beside it, copied `into` the site. Only plain file
    names count: a report cannot pull a file from elsewhere into the site."""
    text = report.read_text(encoding="utf-8", errors="replace")
    names = [n for n in dict.fromkeys(re.findall(r"\]\(([A-Za-z0-9_.-]+\.png)\)", text))
             if (report.parent / n).is_file()]
    into.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copyfile(report.parent / name, into / name)
    return text, names
