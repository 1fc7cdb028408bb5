"""`--help` for every astrai command: panels of options whose names are never cut.

Typer's rich help puts names, negative names, type and help in six table columns that shrink
together at 80 columns, so long names end in `…` and every flag reads `<bool>`. Here each
option is one row: its whole names (`--x/--no-x` for a switch, `--x INT` for a value), then
its help beside them, or on the next lines when the names are wider than the name column
(as click's plain help does). Panels come from each option's `rich_help_panel`; the example
that ends each command's help from `EXAMPLES` in astrai_cli/commands/__init__.py.
"""

from __future__ import annotations

import inspect
from enum import Enum
from typing import Any

NAME_COLUMN = 28  # names up to this width share their line with the help
DEFAULT_PANEL = "Options"


def option_names(param: Any, ctx: Any) -> str:
    """`--a, --alias METAVAR`, `--x/--no-x`, `--flag`, or an argument's `NAME`."""
    if _is_argument(param):
        name = (param.metavar or param.name or "").upper()
        return name + ("..." if param.nargs != 1 and not name.endswith("...") else "")
    names = ", ".join(param.opts)
    if param.secondary_opts:
        names += "/" + ", ".join(param.secondary_opts)
    if _is_flag(param):
        return names
    return f"{names} {metavar(param, ctx)}"


def _is_argument(param: Any) -> bool:
    return param.param_type_name == "argument"


def _is_flag(param: Any) -> bool:
    return bool(getattr(param, "is_flag", False) or getattr(param, "count", False))


def metavar(param: Any, ctx: Any) -> str:
    """INT, FLOAT, TEXT, PATH, or the choices `a|b|c`."""
    if param.metavar:
        return param.metavar
    if hasattr(param, "display_type"):  # typer's own click: "<int>", "<list[str]>", "<a|b>"
        label = param.display_type(ctx).strip("<>").removesuffix(" range")
        if label.startswith("list[") and label.endswith("]"):
            label = label[5:-1]
        choice = getattr(getattr(param, "type_descriptor", None), "is_choice", False)
    else:  # click: the type's name, or the choices
        choice = hasattr(param.type, "choices")
        label = ("|".join(str(getattr(c, "value", c)) for c in param.type.choices)
                 if choice else param.type.name)
    if choice:
        return label
    return {"int": "INT", "integer": "INT", "str": "TEXT", "string": "TEXT"}.get(
        label, label.upper())


def default_text(param: Any, ctx: Any) -> str | None:
    """`[default: X]` as click's plain help words it, or None where nothing is shown."""
    show = getattr(param, "show_default", None)
    if isinstance(show, str):
        return f"[default: {show}]"
    if not (show or ctx.show_default):
        return None
    resilient, ctx.resilient_parsing = ctx.resilient_parsing, True
    try:
        value = param.get_default(ctx, call=False)
    finally:
        ctx.resilient_parsing = resilient
    if value is None or callable(value) or value in ((), [], ""):
        return None
    if _is_flag(param) and not param.secondary_opts:
        return None  # a plain flag is off unless given
    if _is_flag(param) and param.secondary_opts:
        value = (param.opts if value else param.secondary_opts)[0]
    elif isinstance(value, (list, tuple)):
        value = ", ".join(str(v.value if isinstance(v, Enum) else v) for v in value)
    elif isinstance(value, Enum):
        value = value.value
    return f"[default: {value}]"


def help_text(param: Any, ctx: Any):
    from rich.text import Text

    text = Text.from_markup(" ".join((getattr(param, "help", None) or "").split()))
    extra = [e for e in (default_text(param, ctx),
                         "[required]" if param.required else None) if e]
    if extra:
        text.append((" " if text else "") + " ".join(extra), style="dim")
    return text


def _rows(params: list[Any], ctx: Any):
    """One renderable per option: names beside the help, or above it when too wide."""
    from rich.console import Group
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    col = min(NAME_COLUMN, max(len(option_names(p, ctx)) for p in params))
    out = []
    for p in params:
        names, text = option_names(p, ctx), help_text(p, ctx)
        if len(names) <= col:
            grid = Table.grid(padding=(0, 2))
            grid.add_column(width=col, no_wrap=True, style="bold cyan")
            grid.add_column(ratio=1)
            grid.add_row(names, text)
            out.append(grid)
        else:  # names whole on their own line (fold, never cut, if wider than the panel)
            out.append(Group(Text(names, style="bold cyan", overflow="fold"),
                             Padding(text, (0, 0, 0, col + 2))))
    return out


def panels(cmd: Any, ctx: Any) -> dict[str, list[Any]]:
    """Panel title -> its options: Arguments first, the untitled Options last."""
    got: dict[str, list[Any]] = {}
    for p in cmd.get_params(ctx):
        if getattr(p, "hidden", False):
            continue
        title = getattr(p, "rich_help_panel", None) or (
            "Arguments" if _is_argument(p) else DEFAULT_PANEL)
        got.setdefault(title, []).append(p)
    order = sorted(got, key=lambda t: (t != "Arguments", t == DEFAULT_PANEL))
    return {t: got[t] for t in order}


def _paragraphs(text: str):
    from rich.text import Text

    for para in inspect.cleandoc(text).replace("\b\n", "").split("\n\n"):
        yield Text.from_markup(" ".join(para.split()))


def render_help(cmd: Any, ctx: Any) -> None:
    """Print `cmd --help`: usage, description, option panels, subcommands, example."""
    from rich.console import Console, Group
    from rich.padding import Padding
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    from astrai_cli.commands import EXAMPLES

    console = Console(highlight=False)
    console.print(Padding(Text(cmd.get_usage(ctx)), (1, 1, 1, 1)))
    if cmd.help:
        for para in _paragraphs(cmd.help):
            console.print(Padding(para, (0, 1, 1, 1)))
    for title, params in panels(cmd, ctx).items():
        console.print(Panel(Group(*_rows(params, ctx)), title=title,
                            title_align="left", border_style="dim"))
    if hasattr(cmd, "list_commands"):
        names = [n for n in cmd.list_commands(ctx)]
        subs = [(n, cmd.get_command(ctx, n)) for n in names]
        subs = [(n, c) for n, c in subs if c is not None and not c.hidden]
        if subs:
            grid = Table.grid(padding=(0, 2))
            grid.add_column(no_wrap=True, style="bold cyan")
            grid.add_column(ratio=1)
            for n, c in subs:
                grid.add_row(n, Text.from_markup(c.get_short_help_str(limit=200)))
            console.print(Panel(grid, title="Commands", title_align="left",
                                border_style="dim"))
    path = command_path(ctx)
    example = EXAMPLES.get(path) or ([cmd.epilog] if cmd.epilog else [])
    if example:
        body = Text("Example" + ("s" if len(example) > 1 else "") + ":\n", style="bold")
        body.append("\n".join("  " + line for line in example))
        console.print(Padding(body, (0, 1, 1, 1)))


def command_path(ctx: Any) -> str:
    """The words after the program name: "tokenizer train"."""
    words = []
    while ctx.parent is not None:
        words.append(ctx.info_name)
        ctx = ctx.parent
    return " ".join(reversed(words))


class HelpMixin:
    """Mixed into astrai's click commands and groups: `--help` as render_help prints it."""

    __slots__ = ()

    def format_help(self, ctx: Any, formatter: Any) -> None:
        render_help(self, ctx)  # type: ignore[arg-type]


__all__ = ["HelpMixin", "option_names", "render_help"]
