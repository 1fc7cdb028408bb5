"""Broken and hostile chat templates against a real `astrai serve`: one that fails on every
conversation is refused at start-up in one line (exit 2); one that fails, recurses or
allocates without bound on some conversations is a 400 naming the template for those,
quickly, while other clients keep being answered. The server runs with its address space
capped (RLIMIT_AS), so a template the sandbox fails to bound fails the test at once."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from tests.serve.conftest import API_KEY, ServeProcess, wait_until
from tests.serve.test_abuse import post

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")
HOSTILE = (
    "{% macro f(x) %}{{ f(x) }}{% endmacro %}"
    "{% set c = messages[-1]['content'] %}"
    "{% if c == 'boom' %}{{ 1 / 0 }}{% endif %}"
    "{% if c == 'loop' %}{{ f(1) }}{% endif %}"
    "{% if c == 'bomb' %}{{ 'a' * (10**6) * (10**4) }}{% endif %}"
    "{% if c == 'spin' %}{% for i in range(100000) %}{% for j in range(100000) %}"
    "{% endfor %}{% endfor %}{% endif %}" + CHATML)
LIMIT_AS = 4 << 30
"""The server's address-space cap: an idle `astrai serve` maps ~1 GiB; the bomb asks 10."""
VICTIM_BOUND_S = 8.0
"""A /health probe and a one-token completion while the hostile requests run (measured:
well under 0.5 s on a quiet 2-core host, 3.2 s once with a second test run beside it;
unbounded templates held them for minutes)."""


@pytest.fixture(scope="module")
def hostile(ckpt, tmp_path_factory):
    root = tmp_path_factory.mktemp("templates")
    (root / "t.jinja").write_text(HOSTILE)
    srv = ServeProcess([str(ckpt), "--api-key", API_KEY, "--chat-template",
                        str(root / "t.jinja")], root / "err.txt", limit_as=LIMIT_AS)
    yield srv
    srv.stop()


def test_a_template_failing_on_every_chat_is_refused_at_start(ckpt, tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{{ messages[0]['content'] + 1 }}")
    log = tmp_path / "err.txt"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "astrai_cli.main", "serve", str(ckpt), "--port", "0",
             "--device", "cpu", "--chat-template", str(bad)], stdout=subprocess.DEVNULL,
            stderr=err, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:  # it must exit, not listen
        wait_until(lambda: proc.poll() is not None or "listening on" in log.read_text(),
                   timeout=60, what="the server to exit")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    lines = log.read_text().strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, lines
    assert str(bad) in lines[0] and "TypeError" in lines[0], lines


@pytest.mark.parametrize(("content", "why"), [
    ("boom", "ZeroDivisionError"), ("loop", "recursion"), ("bomb", "over the limit"),
])
def test_a_template_failing_on_one_chat_is_a_400_naming_it(hostile, content, why):
    status, body = post(hostile, {"messages": [{"role": "user", "content": content}],
                                  "max_tokens": 1}, "/v1/chat/completions")
    msg = body.get("error", {}).get("message", "")
    assert status == 400 and "chat template" in msg and why in msg, body
    assert "nested too deeply" not in msg


def test_others_are_answered_while_hostile_templates_render(hostile):
    results: list[int] = []

    def attack(content: str) -> None:
        results.append(post(hostile, {"messages": [{"role": "user", "content": content}],
                                      "max_tokens": 1}, "/v1/chat/completions",
                            timeout=30)[0])

    threads = [threading.Thread(target=attack, args=(c,), daemon=True)
               for c in ("spin", "bomb", "spin", "bomb")]
    for t in threads:
        t.start()
    slowest, end = 0.0, time.monotonic() + 30
    while any(t.is_alive() for t in threads) and time.monotonic() < end:
        t0 = time.monotonic()
        assert hostile.get("/health")[0] == 200
        ok = post(hostile, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
                  "/v1/chat/completions", timeout=120)
        assert ok[0] == 200, ok
        slowest = max(slowest, time.monotonic() - t0)
    assert results == [400] * 4 and slowest < VICTIM_BOUND_S, (results, slowest)
    assert hostile.proc.poll() is None
