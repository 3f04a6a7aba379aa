# kvrouter image: `kvrouter serve` on a slim Python, as a non-root user.
#
# Two stages. The builder installs kvrouter the way a user does: it builds kvrouter's wheel
# (the policy presets and the committed gossip protocol code are inside) and installs that
# wheel with its runtime dependencies into /opt/kvrouter (a virtualenv). The final stage is a
# fresh python:3.11-slim that receives only that virtualenv: no compilers, no source tree.
#
#   docker build -t kvrouter:0.1.0 .
#   docker run --rm -p 8000:8000 kvrouter:0.1.0 serve --backend http://host.docker.internal:8001

FROM python:3.11-slim AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

# A C compiler for the decision's compiled loops (router/core/hotpath-c); the final stage gets
# the built extension, never the compiler. The image's Python already carries its headers.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY policies/ policies/
COPY router/ router/

RUN python -m pip wheel --no-deps --wheel-dir /tmp/dist .

# Only prebuilt wheels for the dependencies: a dependency that would need a compiler fails the
# build here rather than dragging build tools into an image. The checks run outside /src, so
# they see the installed package, not the source tree. The kubernetes extra: the chart's
# mode: epp finds its engines through the Kubernetes API.
RUN python -m venv /opt/kvrouter \
 && /opt/kvrouter/bin/pip install --only-binary=:all: "$(ls /tmp/dist/kvrouter-*.whl)[kubernetes]" \
 && cd / \
 && /opt/kvrouter/bin/kvrouter --help > /dev/null \
 && /opt/kvrouter/bin/kvrouter policy check kv-aware > /dev/null \
 && /opt/kvrouter/bin/python -c "import router.gossip.wire, lightkube" \
 && /opt/kvrouter/bin/python -c "from router.core import hotpath; assert hotpath.compiled()"


FROM python:3.11-slim

LABEL org.opencontainers.image.title="kvrouter" \
      org.opencontainers.image.description="KV-cache-aware request router for LLM inference fleets" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PATH=/opt/kvrouter/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

# uid/gid 10001: above any system range, and what the Helm chart's securityContext expects.
RUN groupadd --system --gid 10001 kvrouter \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin kvrouter

COPY --from=builder /opt/kvrouter /opt/kvrouter

USER 10001:10001
WORKDIR /tmp

# The chart runs `kvrouter serve --config /etc/kvrouter/config/config.yaml`; without arguments
# the image runs plain `kvrouter serve`.
# 8000: OpenAI-compatible API, /health, /ready, /metrics. 7946: gossip (gRPC).
EXPOSE 8000 7946

ENTRYPOINT ["kvrouter"]
CMD ["serve"]
