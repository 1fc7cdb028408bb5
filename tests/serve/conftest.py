"""A tiny checkpoint with a tokenizer, and a real `astrai serve` subprocess on a free port.

The model uses init_std=0.2 (as tests/infer) so logits are peaked: greedy tokens do not
hinge on last-bit rounding, and HTTP output can be compared with the in-process engine's.
The server binds port 0 and its "listening on" line (stderr, in a file) says where; the
tests wait for it and for /health by polling, never by sleeping a fixed time.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from astrai.data.testing import tiny_tokenizer
from astrai.model import ModelConfig, build_model
from astrai.model.checkpoint import save_checkpoint

API_KEY = "sk-test"
MAX_CONTEXT = 1024
"""Long enough that a request of max_tokens ~1000 cannot end on its own while a test that
aborts it is still acting: an abort is then the only way it leaves early."""


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("serve")
    tok = tiny_tokenizer(root)
    cfg = ModelConfig(vocab_size=tok.vocab_size, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                      ffn_dim=128, max_seq_len=MAX_CONTEXT, init_std=0.2)
    return save_checkpoint(root / "ckpt", build_model(cfg, seed=0), cfg, tokenizer_dir=tok.path)


def wait_until(pred, timeout: float = 120.0, what: str = "condition"):
    """Poll `pred` until it returns a truthy value (generous timeout, never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _limit_address_space(limit: int | None):
    """A preexec_fn capping the child's address space (RLIMIT_AS), or None: a server that
    a test drives to allocate without bound then fails at once instead of eating the host."""
    if limit is None:
        return None

    def cap() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return cap


class ServeProcess:
    def __init__(self, args: list[str], log: Path, limit_as: int | None = None) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.log = log
        with open(log, "wb") as err:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "astrai_cli.main", "serve", *args, "--port", "0",
                 "--threads", "1", "--device", "cpu"],
                stdout=subprocess.DEVNULL, stderr=err, env=env,
                preexec_fn=_limit_address_space(limit_as))
        self.url = wait_until(self._listening, what=f"the server to listen ({log})")
        wait_until(lambda: self.get("/health")[0] == 200, what="/health")

    def _listening(self) -> str | None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"astrai serve exited {self.proc.returncode}:\n"
                               + self.log.read_text())
        m = re.search(r"listening on (http://\S+)", self.log.read_text())
        return m.group(1) if m else None

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError:
            return 0, ""

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def server(ckpt, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-log") / "stderr.txt"
    srv = ServeProcess([str(ckpt), "--api-key", API_KEY, "--served-model-name", "tiny",
                        "--max-kv-tokens", "4096", "--max-running", "16"], log)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0,
                         timeout=120)
