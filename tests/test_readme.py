"""Figures in README.md, config/README.md and the docs are generated from result files
(tools/readme_figures.py), so they cannot drift from the committed files they come from; the
reference pages are generated from the code they describe."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "tools" / "readme_figures.py"
sys.path.insert(0, str(TOOL.parent))

import cli_reference  # noqa: E402
import readme_figures  # noqa: E402

#: blocks that are slots until their measurement is recorded (make test-durations): empty, and
#: without a committed source, until then
SLOTS = {"test-durations"}


def check(*pages: Path) -> subprocess.CompletedProcess:
    args = [a for page in pages for a in ("--page", str(page))]
    return subprocess.run([sys.executable, str(TOOL), "--check", *args], capture_output=True, text=True)


def test_every_page_matches_its_sources():
    """README.md, config/README.md (the configuration reference the workflow catalog reads) and
    every docs page: each block equals what its sources give, and no prose quotes a figure that
    the page's blocks do not hold."""
    proc = check()
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_readme_stays_short_and_says_how_to_start():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert "make run" in text and "make test" in text
    for path in ("/work", "/tmp", "/root", "/home"):
        assert path not in text, path


def test_no_page_prints_a_machine_path():
    for page in readme_figures.pages():
        text = page.read_text()
        for path in ("/work/", "/tmp/", "/root/", "/home/"):
            assert path not in text, f"{page.relative_to(REPO)}: {path}"


def test_every_block_has_its_source_committed():
    """--check skips a block whose source is missing, so a source left out of git (reports/ is
    ignored unless added with -f) would let its block drift unnoticed in a fresh clone."""
    tracked = set(subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split())
    for page in readme_figures.pages():
        for name, body in readme_figures.blocks(page.read_text()).items():
            paths = [str(p.relative_to(REPO)) for p in readme_figures._paths(readme_figures.SOURCES[name][0])]
            if name in SLOTS and not body.strip() and not any(p in tracked for p in paths):
                continue
            for path in paths:
                assert path in tracked, f"{page.relative_to(REPO)}, block {name}: {path} is not committed"


def test_a_hand_edited_figure_is_reported(tmp_path):
    """The check can fail: a block that is not what its (committed) source gives."""
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- figures:precision -->\n| wanda | 99.9 % |\n<!-- /figures:precision -->\nend\n")
    proc = check(readme)
    assert proc.returncode == 1 and "block precision differs from benchmarks/results/precision.json" in proc.stderr
    subprocess.run([sys.executable, str(TOOL), "--page", str(readme)], check=True, capture_output=True)
    assert check(readme).returncode == 0 and "99.9 %" not in readme.read_text()


def test_a_figure_quoted_outside_the_blocks_is_reported(tmp_path):
    """Prose may repeat a figure its page's blocks hold, and state settings; a measured-looking
    figure that no block holds fails the check."""
    block = readme_figures.render("client-mask")
    held = json.loads((REPO / "benchmarks/results/client_mask.json").read_text())["wanda_over_floor"]
    page = tmp_path / "page.md"
    page.write_text(f"<!-- figures:client-mask -->\n{block}<!-- /figures:client-mask -->\n\n"
                    f"At 50 % sparsity the client takes {held:.2f}× the floor.\n")
    assert check(page).returncode == 0, check(page).stderr
    page.write_text(page.read_text() + "It needs 1,234 MiB and 17.5 s at perplexity 31.17, and `9.9 GiB` in "
                    "code is not prose.\n")
    proc = check(page)
    assert proc.returncode == 1
    assert "'1,234 MiB'" in proc.stderr and "'17.5 s'" in proc.stderr and "'perplexity 31.17'" in proc.stderr
    assert "9.9 GiB" not in proc.stderr


def test_the_configuration_reference_covers_every_schema_key():
    """config/README.md (checked above against its render) names every key of the schema, read
    here by walking the schema independently of the renderer."""
    import yaml

    schema = yaml.safe_load(readme_figures.SCHEMA.read_text())
    text = (REPO / "config/README.md").read_text()

    def keys(props, prefix=""):
        for key, spec in props.items():
            yield prefix + key
            yield from keys(spec.get("properties", {}), f"{prefix}{key}.")

    missing = [k for k in keys(schema["properties"]) if f"| `{k}` |" not in text]
    assert not missing, missing


def test_the_mask_spec_refuses_an_undocumented_field(monkeypatch):
    from fedlib import maskfile

    monkeypatch.setattr(maskfile, "METADATA_FIELDS", (*maskfile.METADATA_FIELDS, "new_field"))
    with pytest.raises(ValueError, match="undocumented \\['new_field'\\]"):
        readme_figures.mask_fields("")


def test_the_cli_reference_lists_every_verb_and_option():
    """Every verb has its section and every option its row there, marked required where the
    parser requires it (walked here with argparse's own attributes, section by section)."""
    import re

    from fedlib.cli import build_parser

    parser = build_parser()
    page = cli_reference.render(parser)
    sections = dict(re.findall(r"^#+ `([^`]+)`\n(.*?)(?=^#+ `|\Z)", page, re.S | re.M))

    def walk(p: argparse.ArgumentParser, words: list[str]):
        yield words, p
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, [*words, name])

    verbs = 0
    for words, p in walk(parser, ["fedlib"]):
        section = sections[" ".join(words)]
        verbs += 1
        for action in p._actions:
            if not action.option_strings or isinstance(action, (argparse._HelpAction, argparse._VersionAction)) \
                    or action.help == argparse.SUPPRESS:
                continue
            row = next((line for line in section.splitlines() if line.startswith(f"| `{action.option_strings[0]}`")), None)
            assert row is not None, (words, action.option_strings)
            assert ("| required |" in row) == bool(action.required), row
    assert verbs > 20


@pytest.mark.parametrize("growth, verdict", [
    ((30.0, 44.0), "met, the growth is 26 MiB + 0.28 × the upload"),   # the committed run's shape
    ((30.0, 160.0), "not met, the growth is -3 MiB + 2.57 × the upload"),  # a coordinator holding every upload
])
def test_the_flower_memory_goal_is_the_slope_of_growth_against_upload(growth, verdict):
    """The goal (at most 2 uploads + a constant) reads the line through the rows' (upload, growth);
    with one upload size there is no constant to separate, and each row is held to 2 uploads."""
    rows = [{"variant": v, "largest_upload_mib": u, "coordinator_replies_growth_mib": g,
             "coordinator_replies_growth_in_uploads": g / u} for v, u, g in zip(("a", "b"), (12.7, 63.3), growth)]
    assert readme_figures._growth_verdict(rows).startswith(verdict)
    assert readme_figures._growth_verdict(rows[:1]) == "not met for a (one upload size: no constant measured)"
