"""`astrai resume RUN_DIR`: continue a run exactly from its newest complete checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from astrai_cli.commands.train_cmd import LAUNCH_HELP, finish, launch_options
from astrai_cli.options import log_console, threads_option, use_threads


def register(app: typer.Typer) -> None:
    @app.command("resume")
    def resume_cmd(
        run_dir: Annotated[Path, typer.Argument(help="Run directory written by `astrai train`.")],
        reward: Annotated[list[str] | None, typer.Option(
            "--reward", help="The run's --reward specs again, in order; required when they "
            "are Python code (module:function, file.py:function): resume never runs code "
            "named only in the run directory.", show_default=False)] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")
                           ] = False,
        tensorboard: Annotated[bool, typer.Option(
            "--tensorboard", help="Also write TensorBoard event files beside metrics.jsonl "
            "(the whole history, then every new record); kept on for later resumes.")] = False,
        rdzv_endpoint: Annotated[str | None, typer.Option(help=LAUNCH_HELP["rdzv_endpoint"],
                                                          show_default=False)] = None,
        rdzv_id: Annotated[str | None, typer.Option(help=LAUNCH_HELP["rdzv_id"],
                                                    show_default=False)] = None,
        shutdown_timeout: Annotated[int | None, typer.Option(
            help=LAUNCH_HELP["shutdown_timeout"], show_default=False)] = None,
        node_rank: Annotated[int | None, typer.Option(
            help=LAUNCH_HELP["node_rank"], show_default=False)] = None,
        max_restarts: Annotated[int | None, typer.Option(
            help=LAUNCH_HELP["max_restarts"], show_default=False)] = None,
        threads: Annotated[str | None, threads_option()] = None,
        parallel: Annotated[str | None, typer.Option(
            help="Continue under another executor (none, ddp, fsdp); a DCP checkpoint "
            "reshards to it.", show_default=False)] = None,
        nprocs: Annotated[int | None, typer.Option(
            help="Continue on another number of processes per node (keep the global batch: "
            "give --batch-size too).", show_default=False)] = None,
        nnodes: Annotated[int | None, typer.Option(
            help="Continue on another number of nodes.", show_default=False)] = None,
        tp: Annotated[int | None, typer.Option(
            help="Continue with another tensor-parallel degree (fsdp; a DCP checkpoint "
            "reshards to it).", show_default=False)] = None,
        batch_size: Annotated[int | None, typer.Option(
            help="Per-process batch size on the new layout; processes x batch x accumulation "
            "must stay the run's.", show_default=False)] = None,
        grad_accum_steps: Annotated[int | None, typer.Option(
            help="Accumulation steps on the new layout.", show_default=False)] = None,
    ) -> None:
        """Continue a run from its newest complete checkpoint: weights, optimizer, scheduler,
        data position, RNG states and counters come back, so the result equals an
        uninterrupted run. Needs no other argument (the resolved config is in the checkpoint),
        except --reward when the run's rewards are Python code."""
        from astrai.train.launch import launch_resume

        launch = launch_options({"rdzv_endpoint": rdzv_endpoint, "rdzv_id": rdzv_id,
                                 "shutdown_timeout": shutdown_timeout,
                                 "node_rank": node_rank, "max_restarts": max_restarts})
        use_threads(threads)
        err = log_console(stderr=True)
        layout = {"parallel": parallel, "nprocs": nprocs, "nnodes": nnodes, "tp": tp,
                  "batch_size": batch_size, "grad_accum_steps": grad_accum_steps}
        summary = launch_resume(run_dir, reward=reward or None, launch=launch, progress=True,
                                console=err, tensorboard=tensorboard, layout=layout)
        finish(summary, as_json)
