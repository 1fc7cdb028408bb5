"""Where the server listens: loopback or not, and whether it can listen there at all.

`check_listen` binds and closes a socket at the address before the model loads, so a
port in use is one line and exit 2 in a second, not a bind error after the weights load.
A process that takes the port between the check and uvicorn's bind still fails cleanly
(Server.run).
"""

from __future__ import annotations

import errno
import ipaddress
import socket

from astrai.errors import ConfigError


def is_loopback(host: str) -> bool:
    """Whether `host` is this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve beyond this machine
        return False


def check_listen(host: str, port: int) -> None:
    """Raise ConfigError (one line) when nothing could listen on host:port now."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise ConfigError(f"--host {host}: cannot resolve it ({e}); give an IP address or "
                          "a name of this machine") from None
    with socket.socket(family, kind, proto) as s:
        # as asyncio's create_server (uvicorn): a port left in TIME_WAIT counts as free
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ConfigError(f"--port {port}: {host}:{port} is already in use; choose "
                                  "another port, or --port 0 for a free one") from None
            raise ConfigError(f"--host {host} --port {port}: cannot listen there "
                              f"({e.strerror}); check the address, or --port 0") from None
