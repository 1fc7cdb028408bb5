"""Hostile chat templates: each rendering is refused with one DataError line, quickly and
without building what it asks for. Each runs in a child process capped at 2 GiB of address
space (RLIMIT_AS) and a wall-clock timeout, so that a template the sandbox fails to bound
fails this test at once instead of eating the machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from astrai.data.chat import render
from astrai.data.chat_templates import NAMED_TEMPLATES

CHILD = textwrap.dedent("""
    import json, resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    from astrai.data import template_sandbox
    template_sandbox.MAX_RENDER_SECONDS = 1.0
    from astrai.data.chat import render
    from astrai.errors import DataError
    t0 = time.monotonic()
    try:
        text = render(sys.argv[1], [{"role": "user", "content": "hi"}])
        out = {"ok": len(text)}
    except DataError as e:
        out = {"error": str(e)}
    except BaseException as e:
        out = {"other": type(e).__name__}
    out["seconds"] = time.monotonic() - t0
    print(json.dumps(out))
""")

HOSTILE = {
    "repeat": ("{{ 'a' * (10**6) * (10**4) }}", "repetition"),
    "filter-width": ("{{ 'a'|center(10**10) }}", "filter center"),
    "method-width": ("{{ 'a'.ljust(10000000000) }}", "argument"),
    "format-width": ("{{ '%0999999999d' % 1 }}", "format width"),
    "doubling": ("{% set ns = namespace(s='a') %}{% for i in range(40) %}"
                 "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}", "over the limit"),
    "replace": ("{% set s = 'a' * 100000 %}{{ s.replace('a', s) }}", "replacement"),
    "long-output": ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
                    "rendered text"),
    "empty-loops": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                    "{% endfor %}", "took over 1 s"),
    "recursion": ("{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}", "recursion"),
    "raises": ("{{ 1 / 0 }}", "ZeroDivisionError"),
    "type-error": ("{{ messages[0]['content'] + 1 }}", "TypeError"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_template_is_one_bounded_error(name):
    source, why = HOSTILE[name]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", CHILD, source], capture_output=True,
                          text=True, timeout=30, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    assert "error" in got, got
    assert why in got["error"] and "\n" not in got["error"], got
    assert got["seconds"] < 10, got


@pytest.mark.parametrize("name", list(NAMED_TEMPLATES))
def test_the_named_templates_render_a_long_chat_as_before(name):
    """The bounds leave real templates alone: a 1,024-message chat renders in full."""
    import jinja2.sandbox

    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 50}
            for i in range(1024)]
    special = {"bos_token": "<s>", "eos_token": "</s>"}
    plain = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True).from_string(NAMED_TEMPLATES[name])
    want = plain.render(messages=msgs, add_generation_prompt=True, tools=None,
                        documents=None, raise_exception=None, **special)
    assert render(NAMED_TEMPLATES[name], msgs, add_generation_prompt=True,
                  special=special) == want
