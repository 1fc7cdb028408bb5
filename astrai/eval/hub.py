"""Whether the Hugging Face Hub, where lm-eval's tasks fetch their datasets, can be reached.

Offline, `datasets` and `huggingface_hub` retry every request for tens of seconds before they
fail; in their offline mode (`HF_HUB_OFFLINE=1`, `HF_DATASETS_OFFLINE=1`, read when they are
imported) they read the local cache at once. `hub_reachable` is the quick probe that lets
`astrai eval --tasks` choose the offline mode on a machine without network (docs/eval.md,
"Offline").
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Mapping
from urllib.parse import urlsplit

OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
DEFAULT_ENDPOINT = "https://huggingface.co"
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def offline_chosen(env: Mapping[str, str] = os.environ) -> bool:
    """True when the user has set either offline variable (to anything: their choice)."""
    return any(env.get(v, "").strip() for v in OFFLINE_VARS)


def probe_address(env: Mapping[str, str] = os.environ) -> tuple[str, int]:
    """(host, port) the first request would connect to: the HTTPS proxy when one is set,
    else the Hub endpoint (`HF_ENDPOINT`, default huggingface.co)."""
    proxy = next((env[v] for v in _PROXY_VARS if env.get(v, "").strip()), None)
    url = urlsplit(proxy if proxy and "://" in proxy else
                   f"http://{proxy}" if proxy else env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    return url.hostname or "huggingface.co", port


def hub_reachable(timeout: float = 3.0, env: Mapping[str, str] = os.environ) -> bool:
    """Whether a TCP connection to the Hub (or the proxy) opens within `timeout` seconds.
    Name resolution ignores socket timeouts, so the probe runs in a thread waited on for
    `timeout` at most."""
    host, port = probe_address(env)
    opened: list[bool] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            opened.append(True)
        except OSError:
            pass

    probe = threading.Thread(target=connect, name="astrai-hub-probe", daemon=True)
    probe.start()
    probe.join(timeout)
    return bool(opened)
