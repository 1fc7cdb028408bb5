"""The chat page at `/` of a real `astrai serve` (base model + two LoRA adapters, with an API
key), driven in Debian's chromium through Playwright: the key asked once on the first 401,
streamed replies with their tokens/s and time to first token, multi-turn history, the stop
button aborting the server's request while another client is served, the adapter picker,
regenerate, thinking shown collapsed, and model text that holds markup shown as text.

Skipped when /usr/bin/chromium or the playwright package is missing, except with
ASTRAI_REQUIRE_BROWSER=1 (.ci/run sets it), where that is a failure. The browser is
launched without networking side channels (no component updates, no QUIC, no background
requests): it reaches only the test's server on 127.0.0.1.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from astrai.data.testing import tiny_tokenizer

from ..infer.lora_fixtures import make_adapters
from .conftest import API_KEY, ServeProcess, wait_until

CHROMIUM = Path("/usr/bin/chromium")
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img" / "chat-page.png"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TIMEOUT_MS = 30_000
CONTEXT = 4096


def _missing() -> str | None:
    if not CHROMIUM.is_file():
        return f"no {CHROMIUM}: apt-get install chromium (Debian's browser)"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed: pip install playwright"
    return None


def base_llama(root: Path, tokenizer_dir: Path) -> Path:
    """A random HF Llama large enough (6 layers, hidden 384) that a few thousand tokens
    take seconds on one CPU thread: a generation the test stops is still running then."""
    import torch
    import transformers

    from astrai.data.tokenizer import Tokenizer

    out = root / "base"
    tok = Tokenizer.load(tokenizer_dir)
    cfg = transformers.LlamaConfig(
        vocab_size=tok.vocab_size, hidden_size=384,
        intermediate_size=1536, num_hidden_layers=6, num_attention_heads=6,
        num_key_value_heads=2, max_position_embeddings=CONTEXT, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # large weights, peaked logits (as lora_fixtures.tiny_llama)
        for p in model.parameters():
            p.normal_(0, 0.2) if p.dim() > 1 else p.fill_(1.0)
        # a special token's logit is then 0, far below the largest of the others: greedy
        # decoding never ends a reply on its own (the stop test relies on that)
        model.lm_head.weight[sorted(tok.special_ids | set(tok.stop_ids))] = 0.0
    model.save_pretrained(out)
    for f in Path(tokenizer_dir).iterdir():
        if f.is_file() and f.name != "config.json":
            (out / f.name).write_bytes(f.read_bytes())
    return out


@pytest.fixture(scope="module")
def servers(ckpt, tmp_path_factory):
    """The page's server (base + two adapters, with a key) and one with --no-ui, started
    side by side: each spends seconds importing and loading."""
    pytest.importorskip("peft")
    root = tmp_path_factory.mktemp("chat-page")
    base = base_llama(root, tiny_tokenizer(root).path)
    args = [str(base), "--api-key", API_KEY, "--served-model-name", "base",
            "--max-kv-tokens", str(2 * CONTEXT), "--max-running", "4"]
    for name, path in make_adapters(root, base).items():
        args += ["--lora", f"{name}={path}"]
    with ThreadPoolExecutor(2) as pool:
        starts = [pool.submit(ServeProcess, args, root / "stderr.txt"),
                  pool.submit(ServeProcess, [str(ckpt), "--no-ui"], root / "no-ui.txt")]
    try:
        yield [s.result() for s in starts]
    finally:
        for s in starts:
            if s.exception() is None:
                s.result().stop()


@pytest.fixture(scope="module")
def server(servers):
    return servers[0]


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    why = _missing()
    if why is not None:
        if os.environ.get("ASTRAI_REQUIRE_BROWSER") == "1":
            pytest.fail(f"ASTRAI_REQUIRE_BROWSER=1 but {why}", pytrace=False)
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=str(CHROMIUM),
            args=ARGS, headless=True, viewport={"width": 1100, "height": 760})
        ctx.set_default_timeout(TIMEOUT_MS)
        yield ctx
        ctx.close()


@pytest.fixture(scope="module")
def page(browser, server):
    """The page open and unlocked: the first /v1/models answered 401, so the page asked
    for the key, once."""
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url + "/")
    page.wait_for_selector("#keydialog[open]")
    page.fill("#key", API_KEY)
    page.click("#keysave")
    page.wait_for_selector("body[data-ready=true]")
    assert page.evaluate("sessionStorage.getItem('astrai-api-key')") == API_KEY
    page.errors = errors
    yield page
    assert errors == [], errors


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json",
                                  "Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def set_controls(page, temperature: str, max_tokens: str) -> None:
    page.fill("#temperature", temperature)
    page.fill("#max_tokens", max_tokens)


def send(page, text: str) -> dict:
    """Type `text`, press Enter, wait for the reply to finish; the request's JSON body."""
    with page.expect_request("**/v1/chat/completions") as req:
        page.fill("#input", text)
        page.press("#input", "Enter")
    finished(page)
    return json.loads(req.value.post_data)


def finished(page) -> None:
    page.wait_for_selector("#stop", state="hidden")


def last_reply(page):
    return page.locator(".message.assistant").last


def test_page_and_assets_are_open_the_api_is_not(server):
    with urllib.request.urlopen(server.url + "/", timeout=30) as r:
        html = r.read().decode()
        csp = r.headers["Content-Security-Policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    # every script is a file of this origin: nothing inline, nothing from elsewhere
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", html, re.DOTALL)
    assert scripts and all(body.strip() == "" and 'src="ui/' in attrs
                           for attrs, body in scripts)
    assert "http://" not in html and "https://" not in html
    assert server.get("/ui/app.js")[0] == 200
    assert server.get("/ui/..%2Fapp.py")[0] == 404
    assert server.get("/v1/models")[0] == 401  # the key still guards the API


def test_page_files_are_package_data():
    """A non-editable install ships the page: pyproject's package-data globs cover every
    file the server reads (chat_page.read_files)."""
    import tomllib

    from astrai.serve.chat_page import ASSETS, PAGE

    root = Path(__file__).resolve().parents[2]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["astrai"]
    shipped = {p for g in globs for p in (root / "astrai").glob(g)}
    for name in (PAGE, *ASSETS):
        assert root / "astrai" / "serve" / "ui" / name in shipped, name


def test_no_ui_leaves_root_a_404(servers):
    srv = servers[1]
    assert srv.get("/")[0] == 404
    assert srv.get("/ui/app.js")[0] == 404
    assert srv.get("/v1/models")[0] == 200


def test_streams_reply_with_stats_and_keeps_history(page, server):
    set_controls(page, "0", "24")
    first = send(page, "Hello there")
    assert first["stream"] is True and first["model"] == "base"
    assert first["temperature"] == 0 and first["max_tokens"] == 24
    # the server's usage (greedy never ends before max_tokens here: base_llama)
    stats = last_reply(page).locator(".stats").inner_text()
    assert re.fullmatch(r"24 tokens · [\d.]+ tok/s · TTFT \d+ ms · base", stats), stats
    # the second turn sends the whole conversation; the first reply, assembled from the
    # stream, is what the server answers without streaming (greedy)
    second = send(page, "And then?")
    roles = [m["role"] for m in second["messages"]]
    assert roles == ["user", "assistant", "user"]
    reference = post(server.url, {"model": "base", "messages": first["messages"],
                                  "temperature": 0, "max_tokens": 24})
    assert second["messages"][1]["content"] == reference["choices"][0]["message"]["content"]


def test_regenerate_replaces_the_last_reply(page):
    before = page.locator(".message.assistant").count()
    with page.expect_request("**/v1/chat/completions") as req:
        page.click("#regenerate")
    finished(page)
    sent = json.loads(req.value.post_data)["messages"]
    assert sent[-1]["role"] == "user" and sent[-1]["content"] == "And then?"
    assert page.locator(".message.assistant").count() == before


def test_adapter_picker_lists_adapters_and_routes_to_them(page):
    options = page.locator("#model option")
    assert [options.nth(i).get_attribute("value") for i in range(options.count())] == [
        "base", "sql", "poet"]
    page.select_option("#model", "sql")
    body = send(page, "Write a query")
    assert body["model"] == "sql"
    reply = last_reply(page)
    assert reply.get_attribute("data-model") == "sql"  # the reply's own model field
    assert reply.locator(".stats").inner_text().endswith("sql")
    page.select_option("#model", "base")


def _metric(server, name: str, label: str = "") -> float:
    """One sample of /metrics: `name` with `label` among its labels (0 when absent)."""
    text = server.get("/metrics")[1]
    m = re.search(rf"^{re.escape(name)}{{[^}}]*{re.escape(label)}[^}}]*}} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


def test_stop_aborts_the_generation_and_others_are_served(page, server):
    def aborted() -> float:
        return _metric(server, "vllm:request_success_total", 'finished_reason="abort"')

    before = aborted()
    # greedy, and the base cannot pick a special token (base_llama): only max_tokens or the
    # stop button can end this reply
    set_controls(page, "0", "2000")  # the history and 2000 fit in CONTEXT
    page.fill("#input", "Tell me a long story")
    page.press("#input", "Enter")
    # (polled from here: the page's CSP refuses the eval that wait_for_function uses)
    wait_until(lambda: len(last_reply(page).locator(".body").inner_text()) > 20,
               timeout=30, what="the reply to stream")
    # another client is answered while the page's reply streams (generous bound: the API
    # request waits behind nothing but a shared batch)
    t0 = time.monotonic()
    other = post(server.url, {"model": "poet", "messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 4})
    assert other["model"] == "poet" and time.monotonic() - t0 < 15
    # text shown while the reply still streams (no stats yet, stop offered)
    assert last_reply(page).locator(".stats").inner_text() == ""
    assert page.is_hidden("#error") and page.is_visible("#stop")
    page.click("#stop")
    finished(page)
    assert last_reply(page).locator(".stats").inner_text().endswith("stopped")
    # the server saw the client go and aborted the request, well before its max_tokens
    wait_until(lambda: aborted() == before + 1, timeout=15,
               what="the page's request to be aborted")
    wait_until(lambda: _metric(server, "astrai:num_requests_in_flight") == 0, timeout=15,
               what="no request in flight")
    assert page.is_enabled("#send")
    set_controls(page, "0", "24")


def test_screenshot(page, tmp_path):
    """The page after the conversations above (real replies of the tiny random model, hence
    the gibberish); written to docs/img with
    ASTRAI_UPDATE_SCREENSHOT=1 (docs/serve.md shows it), to a temporary file otherwise."""
    out = DOCS_IMG if os.environ.get("ASTRAI_UPDATE_SCREENSHOT") == "1" else tmp_path / "p.png"
    page.screenshot(path=str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert DOCS_IMG.is_file(), "run with ASTRAI_UPDATE_SCREENSHOT=1 to write the docs image"


XSS = ('<img src=x onerror="window.pwned=1"> <script>window.pwned=2</script> '
       '[click](javascript:window.pwned=3) **bold** `code` '
       '<a href="javascript:window.pwned=4">a</a>')


def test_markdown_renders_markup_as_text(page):
    html = page.evaluate("""async (text) => {
        const url = new URL('ui/markdown.js', location.href).href;
        const { renderMarkdown } = await import(url);
        const div = document.createElement('div');
        div.append(renderMarkdown(text));
        return div.innerHTML; }""", "# Title\n\nSome *it* and **bold** and `x<y>`\n\n"
                                    "- one\n- [two](https://example.org/?a=1&b=2)\n\n"
                                    "1. first\n2. [bad](javascript:alert(1))\n\n"
                                    "```python\nprint('<b>')\n```\n" + XSS)
    assert html == (
        "<h3>Title</h3><p>Some <em>it</em> and <strong>bold</strong> and "
        "<code>x&lt;y&gt;</code></p><ul><li>one</li><li><a "
        'href="https://example.org/?a=1&amp;b=2" rel="noopener noreferrer nofollow" '
        'target="_blank">two</a></li></ul><ol><li>first</li><li>[bad](javascript:alert(1))'
        '</li></ol><pre><code data-lang="python">print(\'&lt;b&gt;\')</code></pre><p>'
        '&lt;img src=x onerror="window.pwned=1"&gt; &lt;script&gt;window.pwned=2&lt;/script'
        "&gt; [click](javascript:window.pwned=3) <strong>bold</strong> <code>code</code> "
        '&lt;a href="javascript:window.pwned=4"&gt;a&lt;/a&gt;</p>')


def test_reply_with_markup_and_thinking_shows_as_text(page):
    """A stubbed server reply (the tiny model cannot be made to write it): markup in the
    content and in reasoning_content stays text, and both kinds of thinking are collapsed."""
    def chunk(delta: dict) -> str:
        return "data: " + json.dumps({"model": "base", "choices": [
            {"index": 0, "delta": delta, "finish_reason": None}]}) + "\n\n"

    sse = (chunk({"reasoning_content": "<script>window.pwned=5</script>plan"})
           + chunk({"content": "<think>inner <b>x</b></think>"})
           + chunk({"content": XSS}) + "data: [DONE]\n\n")
    page.route("**/v1/chat/completions", lambda route: route.fulfill(
        status=200, headers={"Content-Type": "text/event-stream"}, body=sse))
    try:
        send(page, "show me markup")
    finally:
        page.unroute("**/v1/chat/completions")
    reply = last_reply(page)
    page.wait_for_timeout(200)  # any onerror would have fired by now
    assert page.evaluate("window.pwned") is None
    assert reply.locator("img, script, a[href^=javascript]").count() == 0
    assert '<img src=x onerror="window.pwned=1">' in reply.locator(".body").inner_text()
    thinking = reply.locator("details.thinking")
    assert thinking.get_attribute("open") is None and thinking.is_visible()
    assert "plan" in thinking.text_content() and "inner <b>x</b>" in thinking.text_content()
    assert "<think>" not in reply.locator(".body").inner_text()
