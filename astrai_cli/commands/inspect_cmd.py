"""`astrai inspect-weights CHECKPOINT...`: BF16 lock-in, overflow, dead zone, stuck weights;
`--variance PRESET_OR_CHECKPOINT`: residual-stream variance against the paper's closed form."""

from __future__ import annotations

import contextlib
import json
import math
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from astrai_cli.options import Adapter, checkpoint_path, log_console

_STYLE = {"healthy": "bold green", "suspected": "bold yellow", "found": "bold red"}


def _g(x, digits: int = 4) -> str:
    if x is None:
        return "—"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:.{digits}g}"


def _pct(a: int, b: int) -> str:
    return f"{100 * a / b:.4g}%" if b else "—"


def render_report(report, console: Console, show_tensors: bool) -> None:
    from astrai.inspect.bf16 import dead_zone_threshold
    from astrai.inspect.patterns import fmt_value

    cfg = report.config
    for scan in report.scans:
        head = f"[bold]{scan.path}[/] ({scan.format}"
        head += f", step {scan.step}" if scan.step is not None else ""
        head += f", {scan.n_params:,} parameters"
        head += f", lr {scan.lr:g} from {scan.lr_source}" if scan.lr else ", lr unknown"
        head += f", Muon lr {scan.muon_lr:g} on the hidden matrices)" if scan.muon_lr else ")"
        console.print(head)
        if scan.update is not None:
            console.print(f"Weights: {_MODES[scan.update.mode]} ({scan.update.source})")

        table = Table(title="Affected parameters", title_justify="left")
        for col, just in (("parameter", "left"), ("layers", "left"), ("value", "right"),
                          ("count", "right"), ("location", "left")):
            table.add_column(col, justify=just)  # type: ignore[arg-type]
        total = 0
        for p in scan.patterns:
            table.add_row(p.kind, p.layers.format() if p.layers.ranges else "—",
                          fmt_value(p.value), f"{p.count:,}", p.location())
            total += p.count
        for g in scan.overflow:
            noun = "token" if g.role in ("embedding", "lm_head") else "row"
            what = "non-finite" if g.nonfinite == g.entries else (
                f"|w| > {cfg.overflow:g}" + (" or non-finite" if g.nonfinite else ""))
            table.add_row(f"{g.kind} overflow", g.layers.format() if g.layers.ranges else "—",
                          what, f"{g.entries:,}", g.rows.named(noun))
            total += g.entries
        for st in scan.tensors:
            bad = set(st.bad_rows)
            extra = [r for r, _ in st.extreme_rows if r not in bad]
            if extra:
                table.add_row(f"{st.param.short} extreme rows", "—",
                              f"> {cfg.row_norm_factor:g}x median norm", f"{len(extra):,} rows",
                              "tokens " + ", ".join(map(str, extra[:8])))
        if table.row_count:
            table.add_row("total affected", "", "", f"{total:,}",
                          f"{_pct(total, scan.n_params)} of parameters", style="bold")
            console.print(table)
        else:
            console.print("No locked, overflowed or non-finite weights.")

        offenders = scan.offenders(cfg.top)
        if offenders:
            t = Table(title="Top offenders", title_justify="left")
            for c in ("tensor", "dtype", "shape", "locked", "overflow", "non-finite", "absmax"):
                t.add_column(c, justify="left" if c in ("tensor", "dtype", "shape") else "right",
                             overflow="fold")
            for st in offenders:
                locked = st.locked_count if st.param.role != "gain" else 0
                t.add_row(st.name, st.dtype, "×".join(map(str, st.shape)), f"{locked:,}",
                          f"{st.overflow:,}", f"{st.nonfinite:,}", _g(st.absmax))
            console.print(t)
        t = Table(title="Largest entries", title_justify="left")
        for c in ("tensor", "row", "col", "value"):
            t.add_column(c, justify="left" if c == "tensor" else "right")
        for name, (r, c), v in scan.top_entries(min(cfg.top, 5)):
            t.add_row(name, str(r), str(c), _g(v, 6))
        console.print(t)

        if scan.gains:
            t = Table(title="1-D gains and biases (never decide the verdict by themselves)",
                      title_justify="left")
            for c in ("kind", "tensors", "entries", "exactly 1.0", "min", "max", "locked"):
                t.add_column(c, justify="left" if c in ("kind", "locked") else "right")
            for g in scan.gains:
                locked = ", ".join(f"{fmt_value(v)} ×{n}" for v, n in g.locked[:3]) or "—"
                t.add_row(g.kind, str(g.tensors), f"{g.entries:,}",
                          f"{g.exact_one:,} ({_pct(g.exact_one, g.entries)})",
                          _g(g.min), _g(g.max), locked)
            console.print(t)

        # A Muon run's row pairs two rates: AdamW's (embeddings, head, gains) / Muon's
        # (the hidden matrices it stepped), as the optimizer applied them.
        t = Table(title="BF16 dead zone: an update of size lr is under half a BF16 ULP "
                        "(2^-7 at 1.0)", title_justify="left",
                  caption="run: AdamW lr / Muon lr (hidden matrices)" if scan.muon_lr
                  else None, caption_justify="left")
        for c in ("lr", "stuck when |w| ≥", "all weights", "matrices"):
            t.add_column(c, justify="right")
        for z in scan.dead_zone:
            mark = " (run)" if scan.lr and z.lr == scan.lr else ""
            lr, stuck = f"{z.lr:g}", _g(dead_zone_threshold(z.lr))
            if z.muon_lr:
                lr += f" / {z.muon_lr:g}"
                stuck += f" / {_g(dead_zone_threshold(z.muon_lr))}"
            t.add_row(lr + mark, stuck, f"{100 * z.fraction:.2f}%",
                      f"{100 * z.matrix_fraction:.2f}%")
        console.print(t)
        if scan.visibility is not None:
            _visibility_table(scan.visibility, console, scan.update)
        if show_tensors:
            _tensor_table(scan, console)
        console.print()

    if report.stuck is not None:
        _stuck_table(report.stuck, cfg, console)

    console.print(f"Verdict: [{_STYLE[report.verdict]}]{report.label}[/]")
    several = len(report.scans) > 1
    for f in report.findings:
        where = f"{Path(f.checkpoint).name}: " if several and f.checkpoint else ""
        console.print(f"  [{_STYLE[f.level]}]{f.level}[/] {where}{f.message}", markup=True)
    _terms(cfg, console)
    console.print(
        f"[dim]thresholds: locked = value recurring ≥ {cfg.lock_min_count}x, "
        f"≥ {cfg.lock_min_z:g} robust std out, ≥ {cfg.lock_excess:g}x the expected count; "
        f"overflow |w| > {cfg.overflow:g}; extreme token row > {cfg.row_norm_factor:g}x "
        f"median norm; stuck ≥ {cfg.stuck_min_count} entries (docs/inspect-weights.md)[/]"
    )


_MODES = {
    "fp32": "fp32, nothing rounds",
    "nearest": "bf16 written round-to-nearest: updates under half an ulp are lost",
    "stochastic": "bf16 written with stochastic rounding: unbiased, small updates move "
                  "the weight on average",
    "kahan": "bf16 with Kahan compensation: what a write rounds away is kept and added back",
}


def _terms(cfg, console: Console) -> None:
    """What the report's words mean, and which figures are alarming (docs/inspect-weights.md)."""
    console.print(
        "[dim]ulp (unit in the last place): the gap from a stored value to the next one; "
        "bf16 keeps 8 significant bits, so at 1.0 it is 2^-7 = 0.0078 (fp32: 2^-23).\n"
        "binade: the values between two powers of two, [2^e, 2^(e+1)); all share one ulp.\n"
        "dead zone: the binades where an update of size lr is under half an ulp; written "
        "round-to-nearest, such a weight cannot move.\n"
        f"alarming: any locked, overflowed or non-finite weight; with round-to-nearest bf16, "
        f"≥ {100 * cfg.rounds_away_max:g}% of next updates under half an ulp, or ≥ "
        f"{100 * cfg.frozen_gain_share:g}% of a kind of norm gains still exactly 1.0 after "
        f"training; across checkpoints, stuck entries over {cfg.stuck_excess:g}x what an "
        "unbiased rounding leaves unchanged. Under stochastic rounding, Kahan or fp32 "
        "master weights, a high share under half an ulp is expected and harmless.[/]")


def _visibility_table(v, console: Console, mode=None) -> None:
    """Next update below half an ulp, per kind of tensor (all layers together)."""
    from astrai.inspect.names import parse_name

    if not v.tensors:
        console.print(f"Next update: {v.note or 'no optimizer-trained tensor found'}")
        return
    rows: dict[tuple[str, str], list] = {}
    for t in v.tensors:
        kind = parse_name(t.name, 2).kind
        r = rows.setdefault((kind, t.optimizer), [0, 0, []])
        r[0] += t.entries
        r[1] += t.below
        if t.lr_to_move:
            r[2].append(t.lr_to_move)
    carried = {"stochastic": "stochastic rounding moves them on average (unbiased): not "
                             "lost", "kahan": "the Kahan compensation keeps them: not lost"}
    note = "; ".join(x for x in (v.note, carried.get(getattr(mode, "mode", ""))) if x)
    t = Table(title="Next update below half an ulp (from the optimizer state: written to "
                    "nearest, it would leave the weight unchanged)", title_justify="left",
              caption=note or None, caption_justify="left")
    for c in ("tensor", "optimizer", "entries", "below half ulp", "lr to move half"):
        t.add_column(c, justify="left" if c in ("tensor", "optimizer") else "right",
                     overflow="fold")
    for (kind, opt), (n, below, lrs) in rows.items():
        med = sorted(lrs)[len(lrs) // 2] if lrs else None
        t.add_row(kind, opt, f"{n:,}", _pct(below, n), _g(med) if med else "—")
    t.add_row("all", "", f"{v.entries:,}", _pct(v.below, v.entries), "", style="bold")
    console.print(t)


def _tensor_table(scan, console: Console) -> None:
    t = Table(title="Tensors", title_justify="left")
    for c in ("tensor", "dtype", "shape", "mean", "std", "min", "max", "absmax", "non-finite",
              "locked"):
        t.add_column(c, justify="left" if c in ("tensor", "dtype", "shape") else "right")
    for st in scan.tensors:
        if st.skipped:
            t.add_row(st.name, st.dtype, "×".join(map(str, st.shape)), st.skipped,
                      "", "", "", "", "", "")
            continue
        t.add_row(st.name, st.dtype, "×".join(map(str, st.shape)), _g(st.mean), _g(st.std),
                  _g(st.min), _g(st.max), _g(st.absmax), f"{st.nonfinite:,}",
                  f"{st.locked_count:,}")
    console.print(t)


def _stuck_table(stuck, cfg, console: Console) -> None:
    what = "entries" if stuck.modelled else "entries of moving matrices"
    console.print(
        f"[bold]Stuck across {len(stuck.paths)} checkpoints[/]: {stuck.stuck:,} {what} "
        f"bit-identical ({_pct(stuck.stuck, stuck.moving_entries)} of "
        f"{stuck.moving_entries:,})" + (
            f"; an unbiased rounding would leave about {stuck.expected:,.0f} "
            f"(± {stuck.variance ** 0.5:,.0f}) unchanged, given each entry's updates against "
            "its ulp (optimizer.pt)" if stuck.modelled else
            "; no optimizer state and steps: the raw count decides")
    )
    rows = sorted((s for s in stuck.tensors if s.stuck and (s.counted or
                                                             s.status != "unchanged")),
                  key=lambda s: (not s.counted, -(s.stuck - (s.expected or 0))))[: cfg.top]
    if rows:
        t = Table(title_justify="left")
        for c in ("tensor", "status", "stuck", "expected", "moved", "rows", "cols",
                  "mean |w|"):
            t.add_column(c, justify="right" if c in ("stuck", "expected", "moved", "mean |w|")
                         else "left")
        for s in rows:
            status = s.status if s.counted else f"{s.status} (not counted)"
            t.add_row(s.name, status, f"{s.stuck:,}",
                      f"{s.expected:,.0f}" if s.expected is not None else "—",
                      f"{100 * s.moved_fraction:.2f}%",
                      s.rows.format(3), s.cols.format(3), _g(s.mean_abs))
        console.print(t)
    for counted, why in ((True, "trained, per the optimizer state: counted above"),
                         (False, "frozen or untrained: not counted")):
        names = [t.name for t in stuck.tensors if t.status == "unchanged" and
                 t.counted == counted]
        if names:
            head = ", ".join(names[:6]) + (" …" if len(names) > 6 else "")
            console.print(f"Unchanged tensors ({len(names)}, {why}): {head}")
    if stuck.mismatched:
        console.print(f"Not compared (missing or reshaped): {', '.join(stuck.mismatched[:6])}")
    console.print()


def render_variance(r, console: Console) -> None:
    from astrai.inspect.variance import PAPER_SILU_FACTOR

    L = r.config.n_layers
    console.print(f"[bold]Residual-stream variance[/]: {r.target} (L={L}, d={r.config.dim}, "
                  f"ffn={r.config.ffn_dim}, tokens {r.tokens[0]}×{r.tokens[1]})")
    t = Table(title="Var(x_l) / Var(x_0) after each block", title_justify="left")
    t.add_column("block", justify="right")
    for s in r.series:
        t.add_column(s.name, justify="right")
    for i in range(L):
        t.add_row(str(i), *[_g(s.ratio[i]) for s in r.series])
    t.add_row("Var(x_0)", *[_g(s.entry_var) for s in r.series], style="dim")
    console.print(t)

    cu, cs = r.closed_unscaled, r.closed_scaled
    fu, fs = r.closed_final
    c = Table(title="Closed form (paper §Stage 1, unit-variance input) beside the measurement",
              title_justify="left")
    for col in ("quantity", "unscaled", "scaled"):
        c.add_column(col, justify="left" if col == "quantity" else "right")
    c.add_row("Q/K/V projection", _g(cu.qkv), _g(cs.qkv))
    c.add_row("attention out (W_o)", _g(cu.attn_out), _g(cs.attn_out))
    c.add_row(f"SiLU gate (factor {PAPER_SILU_FACTOR}; exact {r.silu_exact:.3f})",
              _g(cu.silu), _g(cs.silu))
    c.add_row("gated product", _g(cu.product), _g(cs.product))
    c.add_row("down projection (W_down)", _g(cu.down), _g(cs.down))
    c.add_row("per-block residual (closed form)", _g(cu.block), _g(cs.block), style="bold")
    mu, ms = r.get("unit/unscaled"), r.get("unit/scaled")
    c.add_row("per-block residual (measured, unit input)",
              _g(sum(mu.branch) / L), _g(sum(ms.branch) / L))
    c.add_row(f"Var(x_{L}) (closed form: 1 + L × per-block)", _g(fu), _g(fs), style="bold")
    c.add_row(f"Var(x_{L}) / Var(x_0) measured, unit input", _g(mu.ratio[-1]), _g(ms.ratio[-1]))
    eu, es = r.get("unscaled"), r.get("scaled")
    c.add_row(f"Var(x_{L}) / Var(x_0) measured, N(0, {r.config.init_std:g}) embeddings",
              _g(eu.ratio[-1]), _g(es.ratio[-1]))
    console.print(c)
    console.print(
        f"Per-block residual contribution, unscaled / scaled: closed form "
        f"{cu.block / cs.block:.4g} (= 2L = {2 * L}); measured {r.contribution_ratio():.4g} "
        f"(embeddings), {r.contribution_ratio('unit/'):.4g} (unit input)"
    )


def _parse_tokens(text: str | None) -> list[int] | None:
    from astrai.errors import ConfigError

    if text is None:
        return None
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise ConfigError(f"--tokens: '{text}' is not a list of integer token ids "
                          "(e.g. --tokens 1,5,42)") from None
    if not ids:
        raise ConfigError("--tokens: empty list; pass token ids like --tokens 1,5,42")
    return ids


def register(app: typer.Typer) -> None:
    @app.command("inspect-weights")
    def inspect_weights_cmd(
        checkpoints: Annotated[list[str] | None, typer.Argument(
            metavar="CHECKPOINT...",
            help="Checkpoint directories (astrai or HF) or .safetensors files; two or more "
                 "from one run are also compared for stuck weights.")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
        lr: Annotated[float | None, typer.Option(
            "--lr", help="Learning rate for the BF16 dead zone \\[default: from meta.json].")] = None,
        overflow: Annotated[float | None, typer.Option(
            "--overflow", help="|w| above this is overflow \\[default: 1e4].")] = None,
        lock_min_count: Annotated[int | None, typer.Option(
            "--lock-min-count", help="A locked value recurs at least this often per tensor "
                                     "\\[default: 16].")] = None,
        lock_z: Annotated[float | None, typer.Option(
            "--lock-z", help="...and lies this many robust std from the median "
                             "\\[default: 8].")] = None,
        lock_excess: Annotated[float | None, typer.Option(
            "--lock-excess", help="...and recurs this many times more often than the spread "
                                  "explains \\[default: 10].")] = None,
        row_norm_factor: Annotated[float | None, typer.Option(
            "--row-norm-factor", help="Token rows with norm above this × the median are "
                                      "extreme \\[default: 50].")] = None,
        stuck_min_count: Annotated[int | None, typer.Option(
            "--stuck-min-count", help="Stuck entries in moving matrices that make the verdict "
                                      "'suspected' \\[default: 16].")] = None,
        stuck_min_moved: Annotated[float | None, typer.Option(
            "--stuck-min-moved", help="Fraction of a tensor that must change for it to count "
                                      "as moving \\[default: 0.5].")] = None,
        stuck_excess: Annotated[float | None, typer.Option(
            "--stuck-excess", help="With optimizer state, stuck entries must exceed this × "
                                   "what an unbiased rounding leaves unchanged (+4 sd) "
                                   "\\[default: 1.5].")] = None,
        rounds_away_max: Annotated[float | None, typer.Option(
            "--rounds-away-max", help="Round-to-nearest bf16: this share of next updates "
                                      "under half an ulp is suspect \\[default: 0.25].")
        ] = None,
        top: Annotated[int | None, typer.Option(
            "--top", help="Offenders to list \\[default: 10].")] = None,
        tensors: Annotated[bool, typer.Option(
            "--tensors", help="Also print every tensor's statistics.")] = False,
        variance: Annotated[str | None, typer.Option(
            "--variance", metavar="PRESET_OR_CHECKPOINT",
            help="Instead: residual-stream variance per block, with and without residual "
                 "scaling, beside the paper's closed form.")] = None,
        tokens: Annotated[str | None, typer.Option(
            "--tokens", help="--variance: token ids to run (e.g. 1,5,42) \\[default: random].")
        ] = None,
        seq_len: Annotated[int, typer.Option(
            "--seq-len", min=1, help="--variance: random tokens per row.")] = 64,
        batch: Annotated[int, typer.Option(
            "--batch", min=1, help="--variance: rows of random tokens.")] = 1,
        seed: Annotated[int, typer.Option("--seed", help="--variance: RNG seed.")] = 0,
        adapter: Adapter = None,
        all_checkpoints: Annotated[bool, typer.Option(
            "--all-checkpoints", help="A run directory stands for all of its checkpoints, "
                                      "oldest first (default: its newest).")] = False,
        plot: Annotated[Path | None, typer.Option(
            "--plot", metavar="FILE.png",
            help="Also draw the lock-in picture (.png or .svg): per-layer x per-matrix "
                 "locked fraction, and the |w| histogram with the locked values and the BF16 "
                 "dead zone marked.")] = None,
    ) -> None:
        """Find BF16 lock-in, overflow and stuck weights. Exit 0 healthy, 1 findings, 2 bad
        input."""
        from astrai.errors import ConfigError

        console = log_console()
        if variance is not None:
            if checkpoints:
                raise ConfigError("--variance takes no CHECKPOINT arguments; run the two "
                                  "analyses separately")
            from astrai.inspect.variance import residual_variance, variance_dict

            rep = residual_variance(variance, tokens=_parse_tokens(tokens), batch=batch,
                                    seq_len=seq_len, seed=seed)
            if as_json:
                typer.echo(json.dumps(variance_dict(rep), indent=2))
            else:
                render_variance(rep, console)
            return
        if not checkpoints:
            raise ConfigError("inspect-weights: pass at least one CHECKPOINT, or "
                              "--variance PRESET_OR_CHECKPOINT")
        if plot is not None:  # before the scan: a bad path or no matplotlib fails fast
            from astrai.viz.figure import check_out, require_matplotlib

            check_out(plot, "--plot")
            require_matplotlib("inspect-weights --plot")
        from astrai.inspect import InspectConfig, inspect_weights

        cfg = InspectConfig.build(
            lr=lr, overflow=overflow, lock_min_count=lock_min_count, lock_min_z=lock_z,
            lock_excess=lock_excess, row_norm_factor=row_norm_factor,
            stuck_min_count=stuck_min_count, stuck_min_moved=stuck_min_moved, top=top,
            stuck_excess=stuck_excess, rounds_away_max=rounds_away_max,
        )
        from astrai.train.muon import next_step

        paths = _expand(checkpoints) if all_checkpoints else [checkpoint_path(c)
                                                              for c in checkpoints]
        with _progress() as progress:
            report = inspect_weights([str(p) for p in paths], cfg, progress=progress,
                                     adapter=adapter, muon_step=next_step)
        if plot is not None:
            from astrai.viz.figure import save_figure
            from astrai.viz.lockin import lockin_figure

            saved = save_figure(lockin_figure(report.scans, overflow=cfg.overflow), plot)
            typer.echo(f"wrote {saved}", err=True)  # as `astrai plot`; stdout is the report
        if as_json:
            typer.echo(json.dumps(report.to_dict(), indent=2))
        else:
            render_report(report, console, tensors)
        raise typer.Exit(report.exit_code)


def _expand(checkpoints: list[str]) -> list[Path]:
    """--all-checkpoints: each run directory becomes its checkpoints, oldest first."""
    from astrai.errors import ConfigError
    from astrai.model.checkpoint import run_checkpoints

    out = []
    for c in checkpoints:
        found = run_checkpoints(c)
        if not found and (Path(c) / "checkpoints").is_dir():
            raise ConfigError(f"{c}: a run directory with no complete checkpoint yet")
        out.extend(found or [Path(c)])
    return out


@contextlib.contextmanager
def _progress():
    """Yields a progress callback drawing a stderr status line on a TTY (None otherwise)."""
    if not sys.stderr.isatty():
        yield None
        return
    with Console(stderr=True).status("") as status:
        yield lambda name, i, n: status.update(f"inspecting {name} ({i + 1}/{n})")
