"""How `--help` reads, set once on the built click commands (cli.py `build_command`; the CLI reference
docs/cli.md is generated from the same commands):

- help text is written in docstrings wrapped at the source's width: the lines of a paragraph are
  joined, so the terminal wraps them (they were cut mid-sentence at each source line);
- a flag shows no value type (typer printed `<bool>` next to every flag, which takes no value);
- the job flags `run` and `jobs submit` share are grouped into panels by what they decide.
"""

from __future__ import annotations

import re
from typing import Any

# A source line break inside a paragraph; a line that starts a list item or is indented stays.
_WRAPPED = re.compile(r"(?<=\S)[ \t]*\n(?![ \t]*(?:\n|[-*•]\s|\d+[.)]\s|[ \t]))[ \t]*")

JOB_PANELS: dict[str, tuple[str, ...]] = {
    "What to run": (
        "--benchmark", "--dataset", "--input", "--environment", "--num-repeats", "--limit", "--shard",
        "--max-steps", "--agent-program", "--agent-mode", "--oracle",
    ),
    "Sampling": ("--temperature", "--top-p", "--max-tokens", "--logprobs", "--seed"),
    "Failures and retries": (
        "--allowed-failures", "--max-attempts", "--rollout-timeout", "--unavailable-budget",
        "--fail-fast-after", "--replace-groups", "--max-replacements",
    ),
    "Where results go": (
        "--output-dir", "--resume", "--job-id", "--request-id", "--sink-grpc", "--sink-ack-timeout",
        "--sink-window",
    ),
    "Model and mesh": (
        "--model", "--base-url", "--api-key-env", "--backend", "--replicas", "--concurrency",
        "--scheduler", "--api-key",
    ),
}  # fmt: skip
_PANEL_OF = {flag: panel for panel, flags in JOB_PANELS.items() for flag in flags}
_JOB_COMMANDS = {("rollmesh", "run"), ("jobs", "submit")}


def join_wrapped(text: str | None) -> str | None:
    """`text` with the line breaks inside its paragraphs made spaces."""
    return _WRAPPED.sub(" ", text) if text else text


def tidy(command: Any, parent: str = "") -> None:
    """Apply the rules above to `command` (a click command as typer builds it: typer ships its own
    click, so its classes are not `click`'s) and every subcommand."""
    command.help = join_wrapped(command.help)
    command.short_help = join_wrapped(command.short_help)
    grouped = (parent, command.name or "") in _JOB_COMMANDS
    for param in command.params:
        if getattr(param, "param_type_name", "") != "option":
            continue
        param.help = join_wrapped(param.help)
        if param.is_flag and not param.count:
            param.metavar = ""
        if grouped:
            flag = next((o for o in param.opts if o.startswith("--")), "")
            param.rich_help_panel = _PANEL_OF.get(flag)
    make_help_option = command.get_help_option  # --help is made per call, not one of `params`

    def help_option(ctx: Any) -> Any:
        option = make_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option

    command.get_help_option = help_option
    for sub in getattr(command, "commands", {}).values():
        tidy(sub, command.name or "")
