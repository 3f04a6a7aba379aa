"""The one HOST:PORT parser."""

from __future__ import annotations

import pytest

from router import hostport


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10.0.0.1:7946", ("10.0.0.1", 7946)),
        (" name.svc:80 ", ("name.svc", 80)),
        ("[::1]:9000", ("::1", 9000)),
        ("localhost:65535", ("localhost", 65535)),
    ],
)
def test_split_valid(text: str, expected: tuple[str, int]) -> None:
    assert hostport.split(text) == expected
    assert hostport.split(hostport.join(*expected)) == expected


@pytest.mark.parametrize("text", ["host", "host:", ":80", "host:0", "host:65536", "host:x", "[]:1"])
def test_split_invalid_says_what_was_expected(text: str) -> None:
    with pytest.raises(ValueError, match="must be HOST:PORT"):
        hostport.split(text)


def test_split_port_zero_allowed_when_asked() -> None:
    assert hostport.split("127.0.0.1:0", port_zero=True) == ("127.0.0.1", 0)
