"""The disaggregation fields as engine-sim reads them, and the role's command-line flags."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from router.core.disaggregation import DisaggSettings
from router.enginesim import cli
from router.enginesim.disagg_wire import (
    NONE,
    Bootstrap,
    PdFields,
    RemoteKv,
    RoleSettings,
    parse_pd,
    remote_prefill_params,
)
from router.gateway.openai.errors import BadRequest

ANSWERED = remote_prefill_params((3, 4), "engine-a", "req-1", "10.0.0.5", 8100)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(["--port", "0", *argv])


def test_no_fields_is_nothing() -> None:
    assert parse_pd({"model": "m"}) is NONE


def test_prefill_request_of_the_proxy_asks_for_remote_decode() -> None:
    params = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None}
    assert parse_pd({"kv_transfer_params": params}) == PdFields(remote_decode=True)


def test_decode_request_names_its_remote() -> None:
    got = parse_pd({"kv_transfer_params": ANSWERED})
    assert got.remote_prefill == RemoteKv("engine-a", "req-1", (3, 4), "10.0.0.5", 8100)
    assert not got.remote_decode


@pytest.mark.parametrize(
    "change",
    [
        {"remote_block_ids": []},
        {"remote_block_ids": None},
        {"remote_host": 5},
        {"remote_port": 0},
        {"remote_engine_id": None},
    ],
)
def test_remote_prefill_naming_too_little_is_run_whole(change: dict[str, Any]) -> None:
    assert parse_pd({"kv_transfer_params": {**ANSWERED, **change}}).remote_prefill is None


def test_bootstrap_fields_read_and_absent_ones_none() -> None:
    got = parse_pd({"bootstrap_host": "p", "bootstrap_port": None, "bootstrap_room": 2**63 - 1})
    assert got.bootstrap == Bootstrap("p", None, 2**63 - 1)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"kv_transfer_params": "yes"}, "kv_transfer_params"),
        ({"bootstrap_room": -1}, "bootstrap_room"),
        ({"bootstrap_room": 2**63}, "bootstrap_room"),
        ({"bootstrap_room": True}, "bootstrap_room"),
        ({"bootstrap_port": "8998"}, "bootstrap_port"),
        ({"bootstrap_host": ["p"]}, "bootstrap_host"),
    ],
)
def test_wrong_types_are_refused(body: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as exc:
        parse_pd(body)
    assert exc.value.param == param


def test_role_flags() -> None:
    args = parse(
        "--role", "decode", "--link-gbps", "25", "--kv-bytes-per-token", "327680",
        "--bootstrap-port", "9000", "--transfer-timeout", "5", "--kv-load-failure", "recompute",
    )  # fmt: skip
    assert cli.settings_from_args(args).roles == RoleSettings(
        role="decode",
        link=DisaggSettings(link_gbps=25.0, kv_bytes_per_token=327680),
        bootstrap_port=9000,
        wait_seconds=5.0,
        load_failure="recompute",
    )


def test_roles_default_to_an_ordinary_engine() -> None:
    roles = cli.settings_from_args(parse()).roles
    assert roles == RoleSettings()
    assert (roles.role, roles.link, roles.load_failure) == ("both", DisaggSettings(), "fail")


@pytest.mark.parametrize(
    "argv", [["--role", "router"], ["--link-gbps", "0"], ["--kv-load-failure", "retry"]]
)
def test_bad_role_flags_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2


def test_bootstrap_port_out_of_range_returns_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(parse("--bootstrap-port", "70000")) == 2
    assert "bootstrap port" in capsys.readouterr().err
