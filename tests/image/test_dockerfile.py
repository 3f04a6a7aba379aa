"""The Dockerfile and .dockerignore, checked on their text.

No container engine runs here, so the image is not built: its stages, its user, its entrypoint
and what enters the build context are read from the files and checked.
"""

from __future__ import annotations

import re

import pytest

from tests.image.support import DOCKERIGNORE, dockerfile_uid, dockerignore_excludes, stages

BUILD_TOOLS = re.compile(
    r"\b(gcc|g\+\+|clang|make|build-essential|cmake|cargo|rustc|[\w.+-]+-dev|"
    r"grpcio-tools|grpc_tools|apt-get\s+install|apk\s+add|pip\s+install)\b"
)


def test_dockerfile_stages_builder_and_slim_final() -> None:
    assert len(stages()) >= 2
    assert stages()[0].name == "builder"
    assert stages()[-1].base == "python:3.11-slim"


def test_dockerfile_final_stage_user_non_root() -> None:
    user = stages()[-1].last("USER")
    assert user is not None
    assert user.args.split(":")[0] not in {"root", "0"}
    assert dockerfile_uid() == 10001


def test_dockerfile_entrypoint_runs_kvrouter_serve() -> None:
    final = stages()[-1]
    entrypoint, cmd = final.last("ENTRYPOINT"), final.last("CMD")
    assert entrypoint is not None and cmd is not None
    assert entrypoint.exec_form() == ["kvrouter"]
    assert cmd.exec_form()[0] == "serve"


def test_dockerfile_final_stage_installs_no_build_tools() -> None:
    final = stages()[-1]
    offending = [run for run in final.runs() if BUILD_TOOLS.search(run)]
    assert offending == []
    copies = [i.args for i in final.instructions if i.keyword in {"COPY", "ADD"}]
    assert copies and all(c.startswith("--from=builder ") for c in copies), copies


def test_dockerfile_builder_installs_the_wheel_it_builds_and_generates_nothing() -> None:
    # The image installs what a user installs: kvrouter's wheel, with the presets and the
    # committed gossip code inside; no protobuf compiler and no code generation.
    builder = stages()[0]
    runs = builder.runs()
    wheel = next(i for i, r in enumerate(runs) if re.search(r"pip wheel --no-deps", r))
    install = next(
        i for i, r in enumerate(runs) if re.search(r"/opt/kvrouter/bin/pip install .*\.whl", r)
    )
    assert wheel <= install
    assert not [r for r in runs if re.search(r"protogen|protoc|grpc_tools|grpcio-tools", r)]
    copied = " ".join(i.args for i in builder.instructions if i.keyword == "COPY")
    assert "policies/" in copied and "router/" in copied


def test_dockerfile_final_stage_gets_the_builder_venv_on_path() -> None:
    final = stages()[-1]
    assert any(
        i.keyword == "COPY" and i.args.split()[1:] == ["/opt/kvrouter", "/opt/kvrouter"]
        for i in final.instructions
    )
    env = " ".join(i.args for i in final.instructions if i.keyword == "ENV")
    assert "PATH=/opt/kvrouter/bin:" in env


@pytest.mark.parametrize(
    ("path", "excluded"),
    [
        ("pyproject.toml", False),
        ("README.md", False),
        ("policies/kv-aware.yaml", False),
        ("proto/gossip.proto", True),
        ("router/cli.py", False),
        ("router/core/policy.py", False),
        (".venv/bin/python", True),
        (".git/HEAD", True),
        ("tests/test_chart.py", True),
        ("helm/kvrouter/values.yaml", True),
        ("router/__pycache__/cli.cpython-311.pyc", True),
        ("router/gossip/pb/gossip_pb2.py", False),
    ],
)
def test_dockerignore_path_in_context_as_expected(path: str, excluded: bool) -> None:
    patterns = DOCKERIGNORE.read_text().splitlines()
    assert dockerignore_excludes(patterns, path) is excluded


def test_dockerignore_keeps_every_copied_source() -> None:
    patterns = DOCKERIGNORE.read_text().splitlines()
    for stage in stages():
        for copy in (i for i in stage.instructions if i.keyword == "COPY"):
            words = copy.args.split()
            if words[0].startswith("--from="):
                continue
            for src in words[:-1]:
                assert not dockerignore_excludes(patterns, src.rstrip("/")), src
