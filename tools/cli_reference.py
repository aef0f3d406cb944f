"""The CLI reference page, generated from fedlib's argparse parser (fedlib.cli.build_parser), so
that it lists exactly the verbs and options the installed CLI accepts. The docs build writes it
(tools/mkdocs_hooks.py); ``python tools/cli_reference.py`` prints it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "off" if isinstance(action, argparse._StoreTrueAction) else "on"
    if action.default in (None, argparse.SUPPRESS):
        return "–"
    return f"`{action.default}`"


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction, argparse._VersionAction)) \
                or action.help == argparse.SUPPRESS:
            continue
        name = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}` (positional)"
        if action.nargs in ("+", "*"):
            name += " …"
        choices = ", ".join(f"`{c}`" for c in action.choices) if action.choices else ""
        rows.append(f"| {name} | {_default(action)} | {choices} | {_cell(action.help or '')} |")
    return rows


def _subcommands(parser: argparse.ArgumentParser):
    """(name, help, subparser) of each verb, in the order the parser lists them, aliases once."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            seen = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    yield name, helps.get(name, "") or sub.description or "", sub


def _section(parser: argparse.ArgumentParser, words: list[str], out: list[str]) -> None:
    title = " ".join(words)
    out += [f"{'#' * min(len(words) + 1, 4)} `{title}`", ""]
    if parser.description:
        out += [_cell(parser.description), ""]
    rows = _option_rows(parser)
    if rows:
        out += ["| option | default | choices | meaning |", "|---|---|---|---|", *rows, ""]
    for name, _help, sub in _subcommands(parser):
        _section(sub, [*words, name], out)


def render(parser: argparse.ArgumentParser) -> str:
    out = ["# Command-line reference", "",
           "Generated from the parser of `fedlib` (`fedlib.cli.build_parser`) when the docs are built: every verb "
           "and option the CLI accepts, with its default and choices. `fedlib VERB --help` prints the same.", "",
           "| verb | what it does |", "|---|---|"]
    out += [f"| [`{name}`](#fedlib-{name.replace(' ', '-')}) | {_cell(help_)} |" for name, help_, _ in _subcommands(parser)]
    out.append("")
    _section(parser, [parser.prog], out)
    return "\n".join(out) + "\n"


def main() -> int:
    sys.path.insert(0, str(REPO))
    from fedlib.cli import build_parser

    sys.stdout.write(render(build_parser()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
