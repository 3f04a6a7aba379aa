"""``kvrouter engine-sim``: its options, and the real command with the official OpenAI client.

The tests marked ``integration`` start the command as a process on loopback and stop it.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from router.cli import build_parser
from router.core.blocks import CHARS_PER_TOKEN, routing_text
from router.core.engine_model import EngineSpec
from router.enginesim import cli
from router.enginesim.engine import DEFAULT_MODEL, SimSettings
from router.enginesim.responses import EMBEDDING_DIM
from tests.enginesim.support import MODEL, chat, get_json, prompt, wait_for_stats
from tests.support import Proc, running, start_kvrouter

BLOCK_TOKENS = 4


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(["--port", "0", *argv])


def test_arguments_default_to_engine_spec() -> None:
    settings = cli.settings_from_args(parse())
    assert settings == SimSettings(model=DEFAULT_MODEL, spec=EngineSpec(), fast=False)


def test_arguments_every_contract_flag() -> None:
    args = parse(
        "--model", "m", "--kv-capacity-tokens", "1000", "--block-tokens", "8",
        "--prefill-tokens-per-s", "5e3", "--decode-tokens-per-s", "20", "--max-batch", "4",
        "--fast",
    )  # fmt: skip
    spec = EngineSpec(
        capacity_tokens=1000,
        block_tokens=8,
        prefill_tokens_per_s=5e3,
        decode_tokens_per_s=20.0,
        max_batch=4,
    )
    assert cli.settings_from_args(args) == SimSettings(model="m", spec=spec, fast=True)


def test_kvrouter_parser_routes_engine_sim_here() -> None:
    args = build_parser("engine-sim").parse_args(["engine-sim", "--port", "0", "--fast"])
    assert args._module == cli.__name__
    assert args.fast


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--block-tokens", "0"], id="block_tokens_zero_exit_2"),
        pytest.param(["--decode-tokens-per-s", "-1"], id="negative_rate_exit_2"),
        pytest.param(["--max-batch", "many"], id="max_batch_not_a_number_exit_2"),
    ],
)
def test_arguments_invalid_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2


def test_run_capacity_below_one_block_returns_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(parse("--kv-capacity-tokens", "8", "--block-tokens", "16")) == 2
    assert "capacity_tokens" in capsys.readouterr().err


# -- the real command, with the official client -------------------------------------------


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    tmp = tmp_path_factory.mktemp("engine-sim")
    args = ["engine-sim", "--fast", "--block-tokens", str(BLOCK_TOKENS)]
    with running([]) as procs:
        procs.append(start_kvrouter(args, tmp))
        yield procs[0]


@pytest.fixture
def client(sim: Proc) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{sim.url}/v1", api_key="x", max_retries=0, timeout=10) as c:
        yield c


@pytest.mark.integration
def test_openai_client_chat_nonstream_accepted(client: openai.OpenAI) -> None:
    content = prompt(16, start=900)
    messages: Any = [{"role": "user", "content": content}]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3)
    again = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3)
    assert first.choices[0].message.content
    assert first.usage is not None and again.usage is not None
    # The prompt is the router's canonical text: the repeat hits its every full block.
    text = routing_text(chat(content)).text or ""
    full_blocks = len(text) // (BLOCK_TOKENS * CHARS_PER_TOKEN)
    assert first.usage.prompt_tokens == len(text) // CHARS_PER_TOKEN
    assert again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens == full_blocks * BLOCK_TOKENS > 0


@pytest.mark.integration
def test_openai_client_chat_stream_include_usage_accepted(client: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "hi"}]
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 4
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


@pytest.mark.integration
def test_openai_client_completions_stream_and_nonstream_accepted(client: openai.OpenAI) -> None:
    full = client.completions.create(model=MODEL, prompt=prompt(3), max_tokens=2)
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=prompt(3),
            max_tokens=2,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert len(full.choices[0].text.split()) == 2
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 3


@pytest.mark.integration
def test_openai_client_embeddings_and_models_accepted(client: openai.OpenAI) -> None:
    result = client.embeddings.create(model=MODEL, input=["a", "b"])
    assert [len(d.embedding) for d in result.data] == [EMBEDDING_DIM] * 2
    assert [m.id for m in client.models.list()] == [MODEL]


@pytest.mark.integration
def test_openai_client_unknown_model_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        client.completions.create(model="nope", prompt="x")
    assert exc.value.status_code == 404


@pytest.mark.integration
def test_openai_client_injected_503_service_unavailable(sim: Proc, client: openai.OpenAI) -> None:
    with openai.OpenAI(base_url=sim.url, api_key="x", max_retries=0) as admin:
        admin.post("/fault", body={"mode": "status", "status": 503}, cast_to=object)
    with pytest.raises(openai.InternalServerError) as exc:
        client.completions.create(model=MODEL, prompt="x")
    assert exc.value.status_code == 503


@pytest.mark.integration
async def test_process_disconnect_running_back_to_zero_then_sigterm_exit_0(
    procs: list[Proc], tmp_path: Path
) -> None:
    args = ["engine-sim", "--decode-tokens-per-s", "50", "--prefill-tokens-per-s", "1e6"]
    proc = start_kvrouter(args, tmp_path)
    procs.append(proc)
    async with aiohttp.ClientSession(proc.url) as http:
        body = chat(max_tokens=1000, stream=True)
        async with http.post("/v1/chat/completions", json=body) as resp:
            await resp.content.readuntil(b"\n\n")
            assert (await get_json(http, "/stats"))["running"] == 1
            resp.close()
        await wait_for_stats(http, "running", 0)
    assert proc.stop() == 0
