"""README figures are generated from result files (tools/readme_figures.py), so they cannot
drift from the committed JSON they come from."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "tools" / "readme_figures.py"


def check(readme: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), "--check", "--readme", str(readme)], capture_output=True, text=True)


def test_readme_figures_match_their_sources():
    proc = check(REPO / "README.md")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_block_has_its_source_committed():
    """--check skips a block whose source is missing, so a source left out of git (reports/ is
    ignored unless added with -f) would let its block drift unnoticed in a fresh clone."""
    sys.path.insert(0, str(TOOL.parent))
    import readme_figures

    tracked = set(subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split())
    for name in readme_figures.blocks((REPO / "README.md").read_text()):
        for path in readme_figures._paths(readme_figures.SOURCES[name][0]):
            assert str(path.relative_to(REPO)) in tracked, f"block {name}: {path.relative_to(REPO)} is not committed"


def test_a_hand_edited_figure_is_reported(tmp_path):
    """The check can fail: a block that is not what its (committed) source gives."""
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- figures:precision -->\n| wanda | 99.9 % |\n<!-- /figures:precision -->\nend\n")
    proc = check(readme)
    assert proc.returncode == 1 and "block precision differs from benchmarks/results/precision.json" in proc.stderr
    subprocess.run([sys.executable, str(TOOL), "--readme", str(readme)], check=True, capture_output=True)
    assert check(readme).returncode == 0 and "99.9 %" not in readme.read_text()
