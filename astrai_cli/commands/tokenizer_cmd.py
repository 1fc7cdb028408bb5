"""`astrai tokenizer train | info | encode`: byte-level BPE tokenizers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from astrai_cli.options import log_console

tokenizer_app = typer.Typer(help="Train and inspect byte-level BPE tokenizers.",
                            no_args_is_help=True)


def _render(info: dict, console: Console) -> None:
    t = Table(show_header=False, title=f"tokenizer {info['path']}", title_justify="left")
    t.add_column("item", style="cyan")
    t.add_column("value", overflow="fold")
    for k in ("vocab_size", "fingerprint", "bos", "eos", "pad"):
        t.add_row(k, str(info[k]))
    t.add_row("stop_ids", ", ".join(f"{i}:{s}" for i, s in zip(info["stop_ids"],
                                                             info["stop_tokens"])))
    t.add_row("template", info["template"])
    t.add_row("special", ", ".join(f"{i}:{s}" for i, s in info["special_tokens"].items()))
    console.print(t)
    for w in info["warnings"]:
        console.print(f"[yellow]warning:[/] {w}")


@tokenizer_app.command("train")
def train_cmd(
    files: Annotated[list[str], typer.Argument(help="JSONL (.jsonl, .jsonl.gz) or text files; "
                                                    "globs allowed.")],
    vocab_size: Annotated[int, typer.Option("--vocab-size", help="Vocabulary size.")] = 8192,
    out: Annotated[Path, typer.Option("--out", help="Directory to write.")] = Path("tokenizer"),
    field: Annotated[str, typer.Option("--field", help="JSONL field holding the text.")
                     ] = "text",
    min_frequency: Annotated[int, typer.Option("--min-frequency",
                                               help="Least count of a pair to merge.")] = 2,
    template: Annotated[Path | None, typer.Option(
        "--chat-template", help="Jinja chat template file [default: ChatML with BOS].")] = None,
    special: Annotated[list[str] | None, typer.Option(
        "--special", help="Extra special token (repeatable), beside the chat markers.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Train a byte-level BPE tokenizer with special tokens and a chat template."""
    from astrai.data.bpe import SpecialTokens, train_tokenizer
    from astrai.data.chat import CHAT_MARKERS
    from astrai.errors import ConfigError

    err = log_console(stderr=True)
    chat_template = None
    if template is not None:
        if not template.is_file():
            raise ConfigError(f"--chat-template: {template} does not exist")
        chat_template = template.read_text(encoding="utf-8")
    specials = SpecialTokens(extra=[*CHAT_MARKERS, *(special or [])])
    with err.status("training tokenizer...") as status:
        tok = train_tokenizer(files, vocab_size, out, field, specials,
                              min_frequency=min_frequency, chat_template=chat_template,
                              progress=lambda n: status.update(f"training tokenizer... {n} "
                                                               "texts read"))
    from astrai.data.tokenizer_info import tokenizer_info

    info = tokenizer_info(tok)
    if as_json:
        info.pop("chat_template")
        typer.echo(json.dumps(info, indent=2))
    else:
        _render(info, log_console())


@tokenizer_app.command("info")
def info_cmd(
    path: Annotated[Path, typer.Argument(help="Tokenizer directory (astrai or HF).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show a tokenizer's vocabulary size, special tokens, stop ids, chat template, warnings."""
    from astrai.data.tokenizer import Tokenizer
    from astrai.data.tokenizer_info import tokenizer_info

    info = tokenizer_info(Tokenizer.load(path))
    if as_json:
        typer.echo(json.dumps(info, indent=2))
    else:
        _render(info, log_console())


@tokenizer_app.command("encode")
def encode_cmd(
    path: Annotated[Path, typer.Argument(help="Tokenizer directory.")],
    text: Annotated[str, typer.Argument(help="Text to encode.")],
    chat: Annotated[bool, typer.Option(
        "--chat", help="Treat TEXT as one user message and encode it as chat does.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show the ids and pieces of TEXT."""
    from astrai.data.tokenizer import Tokenizer

    tok = Tokenizer.load(path)
    ids = (tok.encode_chat([{"role": "user", "content": text}]) if chat else tok.encode(text))
    pieces = [tok.decode([i], skip_special_tokens=False) for i in ids]
    if as_json:
        typer.echo(json.dumps({"ids": ids, "pieces": pieces}, ensure_ascii=False))
        return
    console = log_console()
    console.print(f"{len(ids)} tokens")
    console.print(" ".join(f"[cyan]{i}[/]:{p!r}" for i, p in zip(ids, pieces)))


def register(app: typer.Typer) -> None:
    app.add_typer(tokenizer_app, name="tokenizer")
