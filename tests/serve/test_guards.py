"""The server's guards in-process: capacity before work, the bearer check on bytes, which
hosts are loopback, and a bind that fails after the model loaded (the tests of a running
server are in test_abuse.py)."""

from __future__ import annotations

import socket

import pytest

from astrai.errors import ConfigError
from astrai.serve.address import is_loopback
from astrai.serve.auth import authorized, key_problem
from astrai.serve.errors import APIError
from astrai.serve.limits import check_capacity
from astrai.serve.protocol import parse


class Refused(Exception):
    pass


class NoWork:
    """A tokenizer that fails the test if anything is tokenized or rendered."""

    def encode(self, text):
        raise AssertionError("tokenized before the capacity check")

    def encode_chat(self, messages, add_generation_prompt=True):
        raise AssertionError("rendered before the capacity check")


@pytest.mark.parametrize(("kind", "body", "choices"), [
    ("completion", {"prompt": ["a", "b", "c"], "n": 5}, 15),
    ("chat", {"messages": [{"role": "user", "content": "hi"}], "n": 7}, 7),
])
def test_capacity_is_checked_before_any_prompt_is_tokenized(kind, body, choices):
    seen = []

    def admit(k: int) -> None:
        seen.append(k)
        raise Refused

    with pytest.raises(Refused):
        parse(kind, body, tokenizer=NoWork(), vocab_size=100, max_context=64, admit=admit)
    assert seen == [choices]


def test_capacity_400_when_it_never_fits_and_503_when_it_does_not_fit_now():
    check_capacity(4, in_flight=6, bound=10)
    with pytest.raises(APIError) as e:
        check_capacity(5, in_flight=6, bound=10)
    assert e.value.status == 503 and e.value.code == "queue_full"
    with pytest.raises(APIError) as e:
        check_capacity(11, in_flight=0, bound=10)
    assert e.value.status == 400 and e.value.param == "n"


def test_the_bearer_check_compares_the_header_bytes_with_the_utf8_key():
    key = "clé à".encode()
    as_starlette = (b"Bearer " + key).decode("latin-1")  # how Starlette hands it over
    assert authorized(as_starlette, key)
    assert authorized(as_starlette.replace("Bearer", "bearer") + " ", key)
    for header in (None, "", "Bearer", "Bearer clé à", "Basic " + as_starlette[7:],
                   (b"Bearer \xff\xfe").decode("latin-1")):
        assert not authorized(header, key), header


@pytest.mark.parametrize(("key", "ok"), [
    ("sk-1", True), ("clé", True), ("a b", True), ("", False), (" sk", False),
    ("sk\t", False), ("s\nk", False), ("\udcff", False)])
def test_which_api_keys_are_accepted(key, ok):
    assert (key_problem(key) is None) == ok


@pytest.mark.parametrize(("host", "loop"), [
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True),
    ("localhost", True), ("0.0.0.0", False), ("::", False), ("10.0.0.5", False),
    ("example.org", False)])
def test_loopback_hosts(host, loop):
    assert is_loopback(host) == loop


def test_a_bind_lost_after_loading_is_one_line(ckpt):
    from astrai.serve import ServeConfig, Server, load_engine

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        config = ServeConfig(str(ckpt), port=busy.getsockname()[1], device="cpu")
        server = Server(load_engine(config), config)  # from_config would refuse first
        with pytest.raises(ConfigError, match="--port 0"):
            server.run()
