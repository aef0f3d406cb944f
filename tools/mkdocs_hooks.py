"""mkdocs hooks (mkdocs.yml ``hooks:``): the generated reference pages and the dates of the
generated blocks, computed when the site is built so that neither can go stale.

- ``reference/cli.md`` is written from fedlib's argparse parser (tools/cli_reference.py).
- After every generated block (tools/readme_figures.py) the page says which files it comes from
  and the commit that last changed them (``git log -1 -- <sources>``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

import cli_reference  # noqa: E402
import readme_figures  # noqa: E402


def on_files(files, config):
    from fedlib.cli import build_parser

    files.append(File.generated(config, "reference/cli.md", content=cli_reference.render(build_parser())))
    return files


def _last_change(paths: tuple[Path, ...]) -> str:
    """'<date> (commit <hash>)' of the last commit that changed any of ``paths``."""
    rel = [str(p.relative_to(REPO)) for p in paths]
    out = subprocess.run(["git", "log", "-1", "--format=%cs (commit %h)", "--", *rel], cwd=REPO,
                         capture_output=True, text=True).stdout.strip()
    return out or "not committed"


_BLOCK = re.compile(r"<!-- figures:([\w-]+) -->\n.*?<!-- /figures:\1 -->", re.S)


def _sources(name: str) -> tuple[Path, ...]:
    return readme_figures._paths(readme_figures.SOURCES[name][0])


def on_page_markdown(markdown, page, config, files):
    def dated(match: re.Match) -> str:
        paths = _sources(match.group(1))
        names = ", ".join(f"`{p.relative_to(REPO)}`" for p in paths)
        return f"{match.group(0)}\n\n<small>Generated from {names}; sources last changed {_last_change(paths)}.</small>\n"

    names = _BLOCK.findall(markdown)
    if page.file.src_uri.startswith("results/") and names:
        # a results page as a whole: the newest change to any of its sources
        paths = tuple(dict.fromkeys(p for name in names for p in _sources(name)))
        markdown = re.sub(r"^(# .*\n)", lambda m: f"{m.group(1)}\n*Results as of {_last_change(paths)}: the newest "
                          f"change to the {'file' if len(paths) == 1 else f'{len(paths)} files'} this page is generated from.*\n", markdown, count=1,
                          flags=re.M)
    return _BLOCK.sub(dated, markdown)
