"""`spolake view`: a static, offline site of a lake: overview, prompt pages with pivotal tokens, run pages.

spo_lake.view.site writes it; spo_lake.view.pages renders typed rows (spo_lake.view.records) into HTML;
spo_lake.view.data reads them from the lake and run directories. Other parts (the demo's report) link into a
site with `prompt_href` / `run_href`, paths relative to the site's directory.
"""
from spo_lake.view.pages import prompt_href, run_href

__all__ = ["prompt_href", "run_href"]
