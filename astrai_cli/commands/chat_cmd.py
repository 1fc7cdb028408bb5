"""`astrai chat CHECKPOINT_OR_HF_DIR`: interactive streaming chat, or one answer with --prompt.

Terminal I/O only; the conversation logic is `astrai.infer.chat_session.ChatSession`.
The reply streams to stdout; banners, notices and command output go to stderr, so
`astrai chat CKPT < script.txt > replies.txt` keeps only the replies.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from astrai_cli.engine_flags import engine_flags
from astrai_cli.options import (
    Backend,
    MaxContext,
    checkpoint_path,
    threads_option,
    use_threads,
    warn_dtype,
)

if TYPE_CHECKING:
    from astrai.infer.build import EngineOptions


@contextlib.contextmanager
def sigint_sets(flag: threading.Event) -> Iterator[None]:
    """While inside, Ctrl-C sets `flag` instead of raising KeyboardInterrupt, so an engine
    step is never torn in half; the reply loop checks the flag between tokens."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    prev = signal.signal(signal.SIGINT, lambda *_: flag.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, prev)


@contextlib.contextmanager
def no_echo(fd: int | None) -> Iterator[None]:
    """While inside, keys typed on the terminal `fd` are not echoed, so text typed while a
    reply streams does not land in the middle of it; it stays in the input queue and shows
    at the next prompt (type-ahead, as in a shell). No-op when `fd` is None."""
    if fd is None:
        yield
        return
    import termios

    old = termios.tcgetattr(fd)
    new = list(old)
    new[3] &= ~termios.ECHO  # local modes
    termios.tcsetattr(fd, termios.TCSANOW, new)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, old)


@contextlib.contextmanager
def sigint_raises() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt inside, whatever the process inherited: started with
    SIGINT ignored (`nohup cmd &`, some CI wrappers), Python keeps ignoring it and Ctrl-C
    at the prompt would do nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    prev = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, prev)


DIM, PLAIN = "\x1b[2m", "\x1b[0m"


def write_delta(delta: str, out: Any, thinking_out: Any = None) -> None:
    """A reply delta on `out`; a thinking delta (chat_reply.Thinking) dimmed on a terminal,
    or on `thinking_out` when given (--prompt: stdout keeps the answer alone)."""
    from astrai.infer.chat_reply import Thinking

    if not delta:
        return
    if isinstance(delta, Thinking):
        dest = thinking_out or out
        tty = getattr(dest, "isatty", lambda: False)()
        dest.write(f"{DIM}{delta}{PLAIN}" if tty else delta)
        dest.flush()
        return
    out.write(delta)
    out.flush()


def stream_reply(reply: Any, out: Any, stop: threading.Event) -> bool:
    """Write the reply's deltas as they come; True when `stop` (Ctrl-C) ended it early."""
    for delta in reply:
        if stop.is_set():
            reply.cancel()
            return True
        write_delta(delta, out)
    return False  # (a Ctrl-C during the last step finds the reply complete: nothing to stop)


def _setup_readline(history_file: Path | None) -> Any:
    try:
        import readline
    except ImportError:  # e.g. Windows without pyreadline: plain input() still works
        return None
    if history_file is not None and history_file.is_file():
        with contextlib.suppress(OSError):
            readline.read_history_file(str(history_file))
    return readline


def length_note(reply: Any, session: Any) -> str:
    """Why a reply that finished with "length" stopped: its --max-tokens, or the context."""
    n = reply.stats().output_tokens
    if n >= session.params.max_tokens:
        return f"(reply cut at --max-tokens {session.params.max_tokens})"
    return (f"(reply cut at the context length: prompt and reply filled all "
            f"{session.max_context} tokens)")


def run_interactive(session: Any, err: Console, history_file: Path | None, title: str) -> None:
    from astrai.errors import AstraiError
    from astrai.infer.chat_session import collect_message

    tty = sys.stdin.isatty()
    readline = _setup_readline(history_file) if tty else None

    def read(prompt: str) -> str:
        return input(prompt if tty else "")

    err.print(f"[bold]astrai chat[/] {escape(title)}\n"
              "[dim]/help for commands · end a line with \\ (or open a block with \"\"\") for "
              "multi-line input · Ctrl-C stops a reply · /exit or Ctrl-D quits[/]")
    def turn() -> bool:
        """Read and handle one message or command; False to leave."""
        try:
            text = collect_message(read)
        except EOFError:
            if tty:
                sys.stdout.write("\n")
            return False
        if not text.strip():
            return True
        if session.is_command(text):
            res = session.command(text)
            if res.message:
                err.print(f"[{'red' if res.error else 'cyan'}]{escape(res.message)}[/]")
            return not res.exit
        stop = threading.Event()
        # from here on Ctrl-C stops this reply only, and typed keys are not echoed into it
        with sigint_sets(stop), no_echo(sys.stdin.fileno() if tty else None):
            try:
                reply = session.reply(session.unescape(text))
            except AstraiError as e:
                err.print(f"[bold red]error:[/] {escape(str(e))}")
                return True
            if reply.notice:
                err.print(f"[yellow]({escape(reply.notice)})[/]")
            stopped = stream_reply(reply, sys.stdout, stop)
        sys.stdout.write("\n")
        sys.stdout.flush()
        if stopped:
            err.print("[yellow](reply stopped)[/]")
        elif reply.finish_reason == "error":
            err.print(f"[bold red]error:[/] the reply failed: {escape(reply.error or '')}")
        elif reply.finish_reason == "length":
            err.print(f"[dim]{escape(length_note(reply, session))}[/]")
        return True

    with sigint_raises():
        try:
            while True:
                try:
                    if not turn():
                        break
                except KeyboardInterrupt:  # outside a reply: no engine step is running
                    sys.stdout.write("\n")
                    err.print("[dim](Ctrl-C at the prompt: type /exit or Ctrl-D to leave)[/]")
        finally:
            if readline is not None and history_file is not None:
                with contextlib.suppress(OSError):
                    readline.write_history_file(str(history_file))


def read_schema(path: Path | None) -> Any:
    """--json-schema FILE as a constraint (None without one); a bad file: ConfigError."""
    if path is None:
        return None
    import json

    from astrai.errors import ConfigError
    from astrai.infer.structured import StructuredOutputs
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"--json-schema {path}: cannot read it ({e.strerror})") from None
    except ValueError as e:
        raise ConfigError(f"--json-schema {path}: not JSON ({e})") from None
    try:
        return StructuredOutputs(json=schema)
    except ConfigError as e:
        raise ConfigError(f"--json-schema {path}: {e}") from None


def check_schema(session: Any, params: Any, path: Path) -> None:
    from astrai.errors import ConfigError
    try:
        session.engine.grammars.compile(params.structured_outputs)
    except ConfigError as e:
        raise ConfigError(f"--json-schema {path}: {e}") from None


def register(app: typer.Typer) -> None:
    @app.command("chat")
    @engine_flags()
    def chat_cmd(
        checkpoint: Annotated[Path, typer.Argument(
            metavar="CHECKPOINT_OR_HF_DIR",
            help="An astrai checkpoint or HF model directory holding tokenizer.json.")],
        prompt: Annotated[str | None, typer.Option(
            "--prompt", "-p", help="Answer this one message and exit: only the reply (and a "
            "newline) goes to stdout. '-' reads the message from stdin.")] = None,
        system: Annotated[str | None, typer.Option(
            "--system", help="System prompt.")] = None,
        no_template: Annotated[bool, typer.Option(
            "--no-template", help="Base model: no chat template; the model continues your "
            "text.")] = False,
        chat_template: Annotated[str | None, typer.Option(
            "--chat-template", metavar="NAME|FILE", help="Use this chat template instead of "
            "the tokenizer's: chatml, llama3, qwen2.5, mistral, llama2, or a .jinja file.")
        ] = None,
        temperature: Annotated[float, typer.Option(
            "--temperature", help="Sampling temperature; 0 = greedy.")] = 0.8,
        top_p: Annotated[float, typer.Option(
            "--top-p", help="Nucleus sampling mass, in (0, 1].")] = 0.95,
        top_k: Annotated[int, typer.Option(
            "--top-k", help="Keep the k most likely tokens; 0 = off.")] = 40,
        max_tokens: Annotated[int, typer.Option(
            "--max-tokens", help="Most tokens per reply.")] = 512,
        seed: Annotated[int | None, typer.Option(
            "--seed", help="Sampling seed (reproducible replies).")] = None,
        json_schema: Annotated[Path | None, typer.Option(
            "--json-schema", metavar="FILE", help="Every reply is JSON valid against this "
            "JSON Schema (a grammar masks the tokens; needs llguidance).")] = None,
        backend: Backend = None,
        max_context: MaxContext = None,
        history_file: Annotated[Path | None, typer.Option(
            "--history-file", help="Keep input history across sessions in this file.")
        ] = None,
        threads: Annotated[str | None, threads_option()] = None,
        *, engine: EngineOptions,
    ) -> None:
        """Chat with a model: streamed replies, /set, /system, /reset, /lora, /stats, /exit."""
        from astrai.infer.chat_session import open_chat
        from astrai.infer.params import SamplingParams

        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                top_k=top_k, seed=seed,  # invalid values: exit 2 here
                                structured_outputs=read_schema(json_schema))
        engine.seed = seed or 0
        use_threads(threads)
        err = Console(stderr=True, highlight=False, soft_wrap=True)
        text = None
        if prompt is not None:
            text = sys.stdin.read() if prompt == "-" else prompt
            if not text.strip():
                from astrai.errors import ConfigError
                raise ConfigError("--prompt is empty: give the message to answer")
        checkpoint = checkpoint_path(checkpoint, err)
        warn_dtype(engine.device, engine.dtype, err)
        session = open_chat(checkpoint, engine, params=params, system=system,
                            template=not no_template, chat_template=chat_template,
                            backend=backend, max_context=max_context)
        if json_schema is not None:  # refused schema features: exit 2 before chatting
            check_schema(session, params, json_schema)
        if text is not None:
            reply = session.reply(text)
            if reply.notice:
                err.print(reply.notice)
            for delta in reply:  # the thinking, if any, on stderr
                write_delta(delta, sys.stdout, sys.stderr)
            if reply.thinking:
                sys.stderr.write("\n")
            sys.stdout.write("\n")
            sys.stdout.flush()
            if reply.finish_reason == "error":
                err.print(f"error: the reply failed: {escape(reply.error or '')}")
                raise typer.Exit(1)
            if reply.finish_reason == "length":  # stdout holds the reply alone, as it is
                err.print(escape(length_note(reply, session)))
            return
        from astrai.model.quant import weight_count

        model = session.engine.model
        n = weight_count(model)
        title = f"{checkpoint} · {n / 1e6:.1f}M params · context {session.max_context}"
        if getattr(model, "quantize", None):
            title += f" · {model.quantize} weights"
        if no_template:
            title += " · no template"
        run_interactive(session, err, history_file, title)
