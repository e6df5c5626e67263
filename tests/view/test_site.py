"""The site as files, without a browser: what `spolake view` writes for the test lake (tests/view/conftest.py)."""
from __future__ import annotations

import pytest

from spo_lake.lake import Lake
from spo_lake.view.site import build_site

pytestmark = pytest.mark.integration  # the test lake is judged in the sandbox


def test_a_snapshots_site_is_the_same_every_time(view_lake, tmp_path):
    """Same snapshot, same site, byte for byte (a site can be diffed, cached, or checked in beside a report)."""
    lake = Lake.open(view_lake.lake)
    for name in ("a", "b"):
        build_site(lake, tmp_path / name, snapshot="v1", tokenizer=view_lake.tokenizer, runs_roots=(view_lake.runs,),
                   show_progress=False)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)
