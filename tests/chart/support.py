"""Helpers for the Helm chart tests: render, validate, parse; no cluster, no network.

Rendering and linting run Helm's own Go library in-process (helm-python-sdk); manifests are
checked against the Kubernetes OpenAPI schemas shipped inside kubernetes-validate. The router's
side of the contracts (metric names, HTTP paths) is written down once here, so that a check
against a live router can replace a constant in one line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import helm_python
import yaml
from helm_python import _native

from router import presets

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "helm" / "kvrouter"
CI_VALUES = sorted((CHART_DIR / "ci").glob("*-values.yaml"))

RELEASE = "edge"
NAMESPACE = "inference"
CLUSTER_DOMAIN = "cluster.local"

# The Kubernetes versions every manifest is validated against: the chart's kubeVersion floor
# and the newest schemas kubernetes-validate ships.
KUBE_VERSIONS = ("1.25", "1.37")

# Kinds whose schema is a CRD's, not Kubernetes': rendered and checked by hand, not validated.
CRD_KINDS = frozenset({"ServiceMonitor", "InferencePool", "HTTPRoute"})
SERVICE_MONITOR_API = "monitoring.coreos.com/v1/ServiceMonitor"

# --- the router's side of the contract ------------------------------------------------------

# Every metric the router exports, by Prometheus type. The dashboard may use these and nothing
# else. A live check can compare this with the names a running router's /metrics lists.
ROUTER_METRICS: Mapping[str, str] = {
    "kvrouter_requests_total": "counter",
    "kvrouter_request_duration_seconds": "histogram",
    "kvrouter_ttft_seconds": "histogram",
    "kvrouter_routing_decision_seconds": "histogram",
    "kvrouter_prefix_overlap_ratio": "histogram",
    "kvrouter_backend_inflight_requests": "gauge",
    "kvrouter_backend_inflight_tokens": "gauge",
    "kvrouter_backend_healthy": "gauge",
    "kvrouter_backend_requests_total": "counter",
    "kvrouter_cached_tokens_total": "counter",
    "kvrouter_prompt_tokens_total": "counter",
    "kvrouter_index_blocks": "gauge",
    "kvrouter_policy_reloads_total": "counter",
    "kvrouter_retries_total": "counter",
    "kvrouter_retries_refused_total": "counter",
    "kvrouter_client_connections": "gauge",
    "kvrouter_client_connections_rejected_total": "counter",
    "kvrouter_admitted_total": "counter",
    "kvrouter_rejected_total": "counter",
    "kvrouter_queue_wait_seconds": "histogram",
    "kvrouter_queue_depth": "gauge",
    "kvrouter_backend_reported_requests": "gauge",
    "kvrouter_backend_kv_usage": "gauge",
    "kvrouter_engine_scrapes_total": "counter",
    "kvrouter_config_reloads_total": "counter",
    "kvrouter_engine_aborts_total": "counter",
    "kvrouter_gossip_peers": "gauge",
    # Engines' KV cache events and the tokenizer behind precise keys
    # (router.gateway.precise.kv_events).
    "kvrouter_kv_events_total": "counter",
    "kvrouter_kv_events_dropped_total": "counter",
    "kvrouter_kv_event_gaps_total": "counter",
    "kvrouter_kv_event_replays_total": "counter",
    "kvrouter_kv_events_degraded_backends": "gauge",
    "kvrouter_kv_event_lag_seconds": "histogram",
    "kvrouter_tokenize_seconds": "histogram",
    "kvrouter_tokenize_failures_total": "counter",
    "kvrouter_index_entries": "gauge",
    "kvrouter_gossip_rounds_total": "counter",
    "kvrouter_gossip_bytes_total": "counter",
    "kvrouter_gossip_deltas_total": "counter",
    # The rest of the gossip node's series (router.gossip.stats), exported with gossip on.
    "kvrouter_gossip_probes_total": "counter",
    "kvrouter_gossip_messages_total": "counter",
    "kvrouter_gossip_call_failures_total": "counter",
    "kvrouter_gossip_load_reports_total": "counter",
    "kvrouter_gossip_snapshots_total": "counter",
    "kvrouter_gossip_refused_total": "counter",
    "kvrouter_gossip_queue_dropped_total": "counter",
    "kvrouter_gossip_errors_total": "counter",
    "kvrouter_gossip_queued_rumours": "gauge",
    "kvrouter_gossip_retained_deltas": "gauge",
    "kvrouter_gossip_retained_bytes": "gauge",
    "kvrouter_gossip_load_origins": "gauge",
    "kvrouter_gossip_incarnation": "gauge",
    "kvrouter_gossip_convergence_lag_seconds": "gauge",
    # Routing quality (router.gateway.quality).
    "kvrouter_prefix_reachable_tokens_total": "counter",
    "kvrouter_prefix_routed_tokens_total": "counter",
    "kvrouter_prefix_achieved_tokens_total": "counter",
    "kvrouter_prefix_belief_error_tokens_total": "counter",
    "kvrouter_decisions_not_deepest_total": "counter",
    # Prefill/decode disaggregation (router.gateway.disagg.metrics).
    "kvrouter_disagg_decisions_total": "counter",
    "kvrouter_disagg_transfer_bytes_total": "counter",
    "kvrouter_disagg_transfer_seconds": "histogram",
    "kvrouter_role_inflight_requests": "gauge",
}

# HTTP paths `kvrouter serve` answers besides /v1/*.
ROUTER_HTTP_PATHS = frozenset({"/health", "/ready", "/metrics"})
ROUTER_HTTP_PORT = 8000
# /metrics on a port of its own (listen.metrics_port): the API port then answers 404 for it.
ROUTER_METRICS_PORT = 9090
ROUTER_GOSSIP_PORT = 7946
# The variable config.yaml's backends.api_key_env names when engines are sent an API key.
ROUTER_ENGINE_KEY_ENV = "KVROUTER_ENGINE_API_KEY"
# The pod's SIGKILL must come this long after the router cuts its streams at the end of
# drain.grace_seconds (the router gives itself as much to stop, router.gateway.runtime.workers).
DRAIN_MARGIN_SECONDS = 5
# Environment the router reads with gossip on (router.gateway.replicas.replica), from the downward
# API: the pod's name is its node id, its IP the address gossip peers dial.
ROUTER_POD_ENV: Mapping[str, str] = {"POD_NAME": "metadata.name", "POD_IP": "status.podIP"}
ROUTER_CONFIG_KEYS = frozenset(
    {
        "listen",
        "policy",
        "policy_reload",
        "backends",
        "health",
        "timeouts",
        "limits",
        "admin_token_env",
        "gossip",
        "flow_control",
        "forwarding",
        "drain",
        "models",
        "tracing",
        "access_log",
        "route_headers",
    }
)
# Sections the config has only where their feature is on: the prefill/decode pools' settings.
ROUTER_OPTIONAL_CONFIG_KEYS = frozenset({"disaggregation"})
# The presets the chart ships: the router's own (tests check that the files are the same bytes).
POLICY_PRESETS = presets.NAMES


def series_names(metrics: Mapping[str, str] = ROUTER_METRICS) -> frozenset[str]:
    """The series names a scrape of the router can contain (histograms as _bucket/_sum/_count)."""
    names: set[str] = set()
    for name, kind in metrics.items():
        if kind == "histogram":
            names.update(f"{name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        else:
            names.add(name)
    return frozenset(names)


# --- rendering ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rendered:
    """One render of the chart: its manifests as parsed objects, and NOTES.txt."""

    objects: tuple[dict[str, Any], ...]
    sources: tuple[str, ...]
    notes: str
    namespace: str = NAMESPACE

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        """The single object of ``kind`` (and ``name``); fail with what there is otherwise."""
        found = [o for o in self.of_kind(kind) if name is None or o["metadata"]["name"] == name]
        if len(found) != 1:
            have = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in self.objects)
            raise AssertionError(f"expected one {kind} {name or ''}, found {len(found)}: {have}")
        return found[0]

    def router_deployment(self) -> dict[str, Any]:
        return self.one("Deployment")

    def router_container(self) -> dict[str, Any]:
        containers = self.router_deployment()["spec"]["template"]["spec"]["containers"]
        return next(c for c in containers if c["name"] == "router")

    def router_config_text(self) -> str:
        """config.yaml as the router reads it, from the ConfigMap its --config path is in."""
        path = config_arg(self.router_container())
        return str(self.configmap_for_file(path)["data"][self.key_for_file(path)])

    def router_config(self) -> dict[str, Any]:
        """config.yaml from the ConfigMap the router's --config path is mounted from."""
        config: dict[str, Any] = yaml.safe_load(self.router_config_text())
        return config

    def mount_for_file(self, path: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The (volumeMount, volume) through which the router container sees ``path``."""
        pod = self.router_deployment()["spec"]["template"]["spec"]
        mounts = [
            m
            for m in self.router_container().get("volumeMounts", [])
            if path.startswith(m["mountPath"].rstrip("/") + "/")
        ]
        if not mounts:
            raise AssertionError(f"{path} is on no volume mount of the router container")
        mount = max(mounts, key=lambda m: len(m["mountPath"]))
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        return mount, volume

    def key_for_file(self, path: str) -> str:
        """The ConfigMap key projected at ``path``."""
        mount, volume = self.mount_for_file(path)
        relative = path[len(mount["mountPath"].rstrip("/")) + 1 :]
        items = volume["configMap"].get("items")
        if items is None:
            return relative
        return str(next(i["key"] for i in items if i["path"] == relative))

    def configmap_for_file(self, path: str) -> dict[str, Any]:
        _, volume = self.mount_for_file(path)
        if "configMap" not in volume:
            raise AssertionError(f"{path} is not mounted from a ConfigMap: {volume}")
        return self.one("ConfigMap", volume["configMap"]["name"])


def config_arg(container: Mapping[str, Any]) -> str:
    """The value of ``--config`` in the container's arguments."""
    args = list(container.get("args", []))
    if "--config" not in args:
        raise AssertionError(f"no --config in {args}")
    return str(args[args.index("--config") + 1])


def load_values_file(path: Path) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(path.read_text()) or {}
    return values


def merged_values(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The chart's values.yaml with ``overrides`` merged in, maps key by key as Helm does."""

    def merge(base: Any, over: Any) -> Any:
        if isinstance(base, Mapping) and isinstance(over, Mapping):
            return {k: merge(base.get(k), over[k]) if k in over else base[k] for k in base} | {
                k: v for k, v in over.items() if k not in base
            }
        return over

    merged: dict[str, Any] = merge(load_values_file(CHART_DIR / "values.yaml"), overrides)
    return merged


def render(
    values: Mapping[str, Any] | None = None,
    *,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    api_versions: Sequence[str] = (),
) -> Rendered:
    """Render the chart offline as `helm install` would (schema checked), and parse it.

    ``api_versions`` plays the part of `helm template --api-versions`: APIs the cluster is
    said to serve, for templates gated on ``.Capabilities.APIVersions``.
    """
    payload = json.dumps(dict(values or {}))
    with helm_python.Chart.load(CHART_DIR) as chart:
        if api_versions:
            # Chart.render() has no api_versions keyword, but the library's render options do
            # (helm_render's JSON options: name, namespace, api_versions, ...).
            opts = {"name": release, "namespace": namespace, "api_versions": list(api_versions)}
            raw = _native.call_string("helm_render", chart._raw(), payload, json.dumps(opts))
            manifests: dict[str, str] = json.loads(raw)
        else:
            manifests = chart.render(values=json.loads(payload), name=release, namespace=namespace)
    objects: list[dict[str, Any]] = []
    sources: list[str] = []
    notes = ""
    for source, text in sorted(manifests.items()):
        if source.endswith("NOTES.txt"):
            notes = text
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                objects.append(doc)
                sources.append(source)
    return Rendered(tuple(objects), tuple(sources), notes, namespace)


def scenarios() -> list[tuple[str, dict[str, Any]]]:
    """(id, values) for the chart defaults and every ci/*-values.yaml file."""
    cases: list[tuple[str, dict[str, Any]]] = [("defaults", {})]
    cases += [(p.name.removesuffix("-values.yaml"), load_values_file(p)) for p in CI_VALUES]
    return cases


SCENARIOS = scenarios()
SCENARIO_IDS = [name for name, _ in SCENARIOS]


@cache
def rendered(scenario: str) -> Rendered:
    """The render of scenario ``scenario`` (an id of ``SCENARIO_IDS``), made once per session."""
    return render(dict(SCENARIOS)[scenario])


def values_of(scenario: str) -> dict[str, Any]:
    """The values scenario ``scenario`` overrides."""
    return dict(SCENARIOS)[scenario]


def lint_findings(values: Mapping[str, Any] | None = None) -> list[str]:
    """`helm lint --strict` findings at warning level or worse, as readable lines."""
    report = helm_python.lint(CHART_DIR, dict(values) if values else None, strict=True)
    found = [
        f"{m['path']}: {m['error']}" for m in report.get("messages") or [] if m["severity"] >= 2
    ]
    return found + [str(e) for e in report.get("errors") or []]


def labels_match(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Whether a matchLabels-style selector selects an object with ``labels``."""
    return all(labels.get(k) == v for k, v in selector.items())


def container_port(container: Mapping[str, Any], port: int | str) -> int:
    """Resolve a port reference (a number or a port name) to the container's port number."""
    if isinstance(port, int):
        return port
    for p in container.get("ports", []):
        if p.get("name") == port:
            return int(p["containerPort"])
    raise AssertionError(f"container {container['name']} has no port named {port!r}")


# --- PromQL ---------------------------------------------------------------------------------

_PROMQL_WORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool"}
    | {"and", "or", "unless", "offset", "inf", "nan"}
)
_GRAFANA_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.*?)\s*(?:,\s*[A-Za-z_]\w*\s*)?\)\s*$")


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or a Grafana label_values query) reads."""
    m = _GRAFANA_LABEL_VALUES.match(expr)
    if m:
        expr = m.group(1)
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"'(?:[^'\\]|\\.)*'", "''", text)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery windows
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\$\{?\w+\}?", " ", text)  # Grafana variables
    names: set[str] = set()
    for word in re.finditer(r"(?<![\w.])[A-Za-z_:][\w:]*", text):
        follows = text[word.end() :].lstrip()
        if follows.startswith("(") or word.group().lower() in _PROMQL_WORDS:
            continue  # a function call or a keyword
        names.add(word.group())
    return names


def dashboard_queries(dashboard: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, query) for every panel target and every query variable of a Grafana dashboard."""

    def panels(items: Iterable[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(dashboard.get("panels", [])):
        for t in p.get("targets", []):
            yield f"panel {p.get('title')!r} target {t.get('refId')}", t["expr"]
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var["query"]
            yield f"variable {var['name']}", query["query"] if isinstance(query, dict) else query
