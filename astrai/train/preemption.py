"""Preemption: SIGTERM / SIGINT end a run cleanly at the next optimizer-step boundary.

Clusters announce preemption with SIGTERM (Kubernetes, SLURM `--signal`, spot VMs) and a
user stops a run with Ctrl+C (SIGINT). While training runs:

1. The first signal only raises a flag. At a step boundary (after optimizer, scheduler
   and counters advanced, so the state is consistent) every rank learns of it — the next
   boundary with one process; with several, the flags are summed over ranks without
   blocking and read one boundary later, so a signal that reached one rank stops all of
   them at the same step —, a checkpoint of that step is saved unless one exists already, and
   training returns with `preempted=True`. `astrai train` / `astrai resume` then exit with
   EXIT_PREEMPTED (75, sysexits' EX_TEMPFAIL: "try again"); `astrai resume RUN_DIR`
   continues exactly.
2. A second signal, at least `grace_s` after the first, ends the process at once
   (exit 128 + signal number) from a watcher thread, even when the main thread is stuck in
   a collective or a long kernel. Checkpoints appear only by an atomic rename, so the last
   complete one is intact; a half-written temporary directory is never taken for one and is
   deleted by the next save.

After a stop the signals stay caught until the process exits (a repeat inside the grace
period is still ignored), so the run reports and exits 75 rather than dying by signal.

Why the grace period: a launcher forwards the signal it receives to its workers, and Ctrl+C
also reaches the workers directly from the terminal, so one keypress can arrive twice
within milliseconds; that must not count as the second, "exit now" signal.

The watcher reads signal numbers from `signal.set_wakeup_fd`, which CPython writes from the
C-level handler the moment the signal arrives; Python-level handlers only run when the main
thread returns to the interpreter.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from astrai.train.callbacks.base import Callback

if TYPE_CHECKING:
    from astrai.train.context import TrainContext
    from astrai.train.report import StepControl, StepReport

EXIT_PREEMPTED = 75
"""Exit status of a run stopped by SIGTERM/SIGINT after saving its checkpoint."""
SIGNALS = (signal.SIGTERM, signal.SIGINT)
SIGNAL_SEEN = False
"""Whether this process caught a stop signal (a launched worker then exits once done)."""


class PreemptionGuard:
    """Catches SIGTERM/SIGINT between install() and uninstall() (main thread only)."""

    def __init__(self, signals: tuple[int, ...] = SIGNALS, grace_s: float = 1.0, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.signals, self.grace_s, self.clock = tuple(signals), grace_s, clock
        self.signum: int | None = None
        """The first signal received (None: none yet)."""
        self._first = 0.0
        self._lock = threading.Lock()
        self._old_handlers: dict[int, object] = {}
        self._old_fd: int | None = None
        self._pipe: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def installed(self) -> bool:
        return self._pipe is not None

    def install(self) -> bool:
        """Take over the signals; False (and nothing done) outside the main thread."""
        if self.installed or threading.current_thread() is not threading.main_thread():
            return False
        r, w = os.pipe()
        os.set_blocking(w, False)
        self._pipe = (r, w)
        for sig in self.signals:
            # A Python handler must be installed for CPython to write the wakeup fd; the
            # decision itself is taken by the watcher thread.
            self._old_handlers[sig] = signal.signal(sig, self._python_handler)
        self._old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, args=(r,), name="astrai-preemption",
                                        daemon=True)
        self._thread.start()
        return True

    def uninstall(self, linger: bool = False) -> None:
        """Give the signals back. linger: a stop was requested and the process is about to
        exit (75); the signals stay caught by a plain handler with the same rule (a repeat
        within grace_s is ignored, a later one exits 128 + signal) instead of the default
        action, which would kill the process by signal 143 while it reports and exits."""
        if not self.installed:
            return
        signal.set_wakeup_fd(self._old_fd if self._old_fd is not None else -1)
        for sig, old in self._old_handlers.items():
            signal.signal(sig, self._late_handler if linger else old)
        self._old_handlers.clear()
        r, w = self._pipe
        self._pipe = None
        os.close(w)  # the watcher reads EOF and ends
        if self._thread is not None:
            self._thread.join(timeout=5)
        os.close(r)

    def _python_handler(self, signum, frame) -> None:
        pass

    def _late_handler(self, signum, frame) -> None:
        self.notify(signum)

    def _watch(self, fd: int) -> None:
        while True:
            try:
                data = os.read(fd, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum in self.signals:
                    self.notify(signum)

    def notify(self, signum: int) -> None:
        """Record one signal: the first asks for a stop; a later one exits now."""
        global SIGNAL_SEEN
        SIGNAL_SEEN = True
        with self._lock:
            now = self.clock()
            if self.signum is None:
                self.signum, self._first = signum, now
            elif now - self._first >= self.grace_s:
                os._exit(128 + signum)


class PreemptionCallback(Callback):
    """Asks the trainer to stop at the step boundary after a signal
    (StepControl.request_stop); the trainer then writes a checkpoint of that step unless it
    has one already."""

    name = "preemption"

    def __init__(self, guard: PreemptionGuard | None = None) -> None:
        self.guard = guard or PreemptionGuard()
        self._pending = None  # (work, tensor) of the flag sum started at the last boundary

    def on_epoch_begin(self, ctx: TrainContext) -> None:
        # Not on_train_begin: a later callback failing there skips on_train_end, which
        # would leave the handlers installed. Epochs run inside the trainer's try/finally.
        self.guard.install()

    def _agreed(self, ctx: TrainContext) -> bool:
        """Whether any rank had a signal by the previous boundary (one process: by this
        one). The sum over ranks is started asynchronously at each boundary and read at
        the next, so agreeing costs no extra synchronisation point per step."""
        if ctx.world_size == 1:
            return self.guard.requested
        import torch
        import torch.distributed as dist

        stop = False
        if self._pending is not None:
            work, flag = self._pending
            work.wait()
            stop = bool(flag.item() > 0)
        flag = torch.tensor([1.0 if self.guard.requested else 0.0], device=ctx.executor.device)
        self._pending = (dist.all_reduce(flag, async_op=True), flag)
        return stop

    def on_step_end(self, ctx: TrainContext, report: StepReport,
                    control: StepControl) -> None:
        stop = self._agreed(ctx)  # collective: every rank calls it at every step
        if not stop or report.done:
            return
        sig = self.guard.signum
        control.request_stop(f"preempted by {signal.Signals(sig).name}" if sig is not None
                             else "preempted by a signal to another rank")

    def on_train_end(self, ctx: TrainContext) -> None:
        if self._pending is not None:
            self._pending[0].wait()  # every rank started it; none may leave it in flight
            self._pending = None
        # preempted: the process exits 75 next; a repeat of the signal must not kill it first.
        # Not in a worker of torch's elastic agent: after a signal the agent sends its own
        # SIGTERM and waits for the worker to die of it (it never tells a finished worker to
        # leave), so a worker that kept ignoring it would hold the job until the agent's
        # shutdown timeout.
        launched = "TORCHELASTIC_RUN_ID" in os.environ
        self.guard.uninstall(linger=ctx.stop_reason is not None and not launched)
