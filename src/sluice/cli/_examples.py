"""The most common use of each command, as the last line of its ``--help``.

Kept apart from the commands so each stays one line here, and a test (tests/test_docs.py)
holds every command to having one.
"""

from __future__ import annotations

import click

__all__ = ["EXAMPLES", "add_examples"]

#: A command's path (``"config check"``) -> the line its help ends on.
EXAMPLES = {
    "": "sluice run examples/questions.jsonl -o results.jsonl --model simulate/demo",
    "run": "sluice run prompts.jsonl -o results.jsonl --model openai/gpt-4o-mini --rpm 500 --budget 5",
    "estimate": "sluice estimate prompts.jsonl --model openai/gpt-4o-mini --rpm 500",
    "report": "sluice report results.jsonl --html report.html",
    "export": "sluice export results.jsonl --csv results.csv",
    "cancel": "sluice cancel results.jsonl",
    "worker": "sluice worker --redis redis://queue:6379/0 --config sluice.toml",
    "serve": "sluice serve --config sluice.toml --port 8000",
    "config": "sluice config check",
    "config check": "sluice config check --config sluice.toml",
    "config trust": "sluice config trust sluice.toml",
}


def add_examples(group: click.Group, path: str = "") -> None:
    """Give ``group`` and each of its commands (and theirs) its example as its epilog."""
    for name, command in [("", group), *group.commands.items()]:
        where = " ".join(part for part in (path, name) if part)
        if command is not group and isinstance(command, click.Group):
            add_examples(command, where)
        elif where in EXAMPLES:
            # \b: click prints the paragraph as it is, not rewrapped
            command.epilog = f"\b\nExample:\n  {EXAMPLES[where]}"
