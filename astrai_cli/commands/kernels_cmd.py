"""`astrai kernels`: what CUDA kernels are built, for which GPUs, and why something is not;
and the CPU decode kernels' code path."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from astrai_cli.options import log_console


def render(st: dict, console: Console) -> None:
    t = Table(title="CUDA kernels", show_header=False, title_justify="left")
    t.add_column("item", style="cyan")
    t.add_column("value", overflow="fold")
    t.add_row("ready", "[green]yes[/]" if st["ready"] else "[yellow]no[/] (ops use torch references)")
    t.add_row("sources", st["sources"] + ("" if st["sources_found"] else "  [red](missing)[/]"))
    t.add_row("nvcc", f"{st['nvcc']} ({st['nvcc_version']})" if st["nvcc"] else "[red]not found[/]")
    t.add_row("targets", ", ".join(f"sm_{a}" for a in st["archs"]) or "-")
    t.add_row("device", st["device"] or "none")
    lib = st["library"] or "-"
    t.add_row("library", lib + ("" if st["built"] else "  (not built)"))
    if st["built"]:
        t.add_row("built for", ", ".join(f"sm_{a}" for a in st["built_archs"]))
    if st["build_seconds"]:
        t.add_row("build time", f"{st['build_seconds']:.1f} s")
    for why in st["reasons"]:
        t.add_row("why not", why)
    console.print(t)
    ops = Table(title="Ops (torch.ops.astrai.*)", title_justify="left")
    for col in ("op", "kernel dtypes", "kernel head dims"):
        ops.add_column(col)
    for name, (dtypes, dims) in st["ops"].items():
        ops.add_row(name, dtypes, dims)
    console.print(ops)
    render_cpu(st["cpu"], console)


def render_cpu(cpu: dict, console: Console) -> None:
    t = Table(title="CPU decode kernels (docs/kernels.md)", show_header=False,
              title_justify="left")
    t.add_column("item", style="cyan")
    t.add_column("value", overflow="fold")
    extras = [n for n, on in (("VNNI", cpu.get("vnni")), ("AVX512-BF16", cpu.get("bf16"))) if on]
    t.add_row("code path", (cpu.get("isa") or "none") + (f" ({', '.join(extras)})"
                                                          if cpu.get("isa") and extras else ""))
    t.add_row("compiler", cpu.get("compiler") or "[red]not found[/]")
    if cpu.get("library"):
        t.add_row("library", cpu["library"] + ("" if cpu.get("built") else "  (not built)"))
    if cpu.get("fp32_one_row"):
        t.add_row("one fp32 row", cpu["fp32_one_row"])
    if cpu.get("reason"):
        t.add_row("why not", cpu["reason"])
    console.print(t)


def run_verify(as_json: bool) -> None:
    """Print every check's row (astrai.infer.verify); exit 1 when one failed."""
    from astrai.infer.verify import verify_all

    checks = verify_all()
    if as_json:
        typer.echo(json.dumps([c._asdict() for c in checks], indent=2))
    else:
        t = Table(title="Accelerated paths against their references", title_justify="left")
        for col in ("check", "status", "detail"):
            t.add_column(col, overflow="fold")
        style = {"ok": "green", "FAILED": "red"}
        for c in checks:
            t.add_row(escape(c.name), f"[{style.get(c.status, 'dim')}]{c.status}[/]",
                      escape(c.detail))
        log_console().print(t)
    if any(c.status == "FAILED" for c in checks):
        raise typer.Exit(1)


def run_calibration() -> dict:
    """Calibrate the CPU decode kernels' one-row choice (builds them first where needed);
    their absence is the user's to fix: one line, exit 2."""
    from astrai.errors import ConfigError
    from astrai.kernels.cpu_build import CpuKernelUnavailable
    from astrai.kernels.cpu_linear import calibrate_one_row

    log_console(stderr=True).print("timing one fp32 row on the CPU decode kernel and on "
                                   "torch (a few seconds)...")
    try:
        cal = calibrate_one_row()
    except CpuKernelUnavailable as e:
        raise ConfigError(f"--calibrate: {e}") from None
    us = cal["median_us"]
    log_console(stderr=True).print(
        f"one fp32 row: {cal['fp32_one_row']} (median of {cal['rounds']} rounds over 16 MB: "
        f"kernel {us['kernel']:.0f} µs, torch {us['torch']:.0f} µs); kept for this build")
    return cal


def register(app: typer.Typer) -> None:
    @app.command("kernels")
    def kernels_cmd(
        build: Annotated[bool, typer.Option(
            "--build", help="Build the libraries now (CUDA: needs nvcc, not a GPU; CPU: a C++ "
            "compiler); cached afterwards.")
        ] = False,
        force: Annotated[bool, typer.Option("--force", help="With --build: rebuild.")] = False,
        archs: Annotated[str | None, typer.Option(
            "--archs", help="Targets, e.g. '80;90' [default: ASTRAI_CUDA_ARCHS or 80;90].")
        ] = None,
        calibrate: Annotated[bool, typer.Option(
            "--calibrate", help="Time one fp32 row on the CPU decode kernel and on torch's GEMV "
            "(a few seconds; run it on an idle machine) and keep the faster for this build.")
        ] = False,
        verify: Annotated[bool, typer.Option(
            "--verify", help="Check every accelerated path here (CPU kernels, decode paths, "
            "CUDA attention) against its reference on tiny inputs; exit 1 if one fails.")
        ] = False,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Report the CUDA kernels (built or not, for which GPUs, why not) and the CPU decode
        kernels (code path, built or not, who serves one fp32 row)."""
        from astrai.errors import ConfigError
        from astrai.kernels.build import parse_archs
        from astrai.kernels.status import kernel_status

        try:
            arch_list = parse_archs(archs, "--archs") if archs else None
        except ValueError as e:
            raise ConfigError(str(e)) from e
        if build:
            log_console(stderr=True).print("building CUDA kernels (nvcc; a minute or two the first "
                                       "time)...")
        if verify:
            run_verify(as_json)
            return
        cal = run_calibration() if calibrate else None
        st = kernel_status(build=build, force=force, archs=arch_list).to_dict()
        if cal is not None:
            st["cpu"]["calibration"] = cal
        if as_json:
            typer.echo(json.dumps(st, indent=2))
        else:
            render(st, log_console())
        if build and not st["built"]:
            raise typer.Exit(1)
