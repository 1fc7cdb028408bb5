"""`astrai serve` on a DCP checkpoint (every rank's shards, --checkpoint-format dcp): the
same greedy completions as on the full checkpoint it was converted from; a DCP directory
with a missing shard stops the server before it listens, in one line, exit 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request

import pytest

from astrai.train.convert_checkpoint import convert_checkpoint

from .conftest import API_KEY, ServeProcess


@pytest.fixture(scope="module")
def dcp_ckpt(ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("serve-dcp") / "dcp"
    assert convert_checkpoint(ckpt, out) == "dcp"
    return out


def complete(srv: ServeProcess, prompt: str) -> str:
    req = urllib.request.Request(
        srv.url + "/v1/completions", data=json.dumps(
            {"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())["choices"][0]["text"]


def test_serves_a_dcp_checkpoint_like_the_full_one(server, dcp_ckpt, tmp_path):
    srv = ServeProcess([str(dcp_ckpt), "--api-key", API_KEY, "--served-model-name", "tiny",
                        "--max-kv-tokens", "4096"], tmp_path / "stderr.txt")
    try:
        for prompt in ("Once upon a time", "The river"):
            got = complete(srv, prompt)
            assert got and got == complete(server, prompt)
    finally:
        srv.stop()


def test_a_dcp_checkpoint_with_a_missing_shard_is_one_line(dcp_ckpt, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(dcp_ckpt, bad)
    (bad / "dcp" / "__0_0.distcp").unlink()
    r = subprocess.run([sys.executable, "-m", "astrai_cli.main", "serve", str(bad), "--port",
                        "0", "--device", "cpu", "--threads", "1"], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"},
                       check=False)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "__0_0.distcp: missing shard" in lines[0], r.stderr
