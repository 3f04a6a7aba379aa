"""The endpoint picker's own series (``kvrouter_epp_*``), in the gateway's registry.

The shared series count picker requests too where they mean the same: ``kvrouter_requests``
(route and final status; 499 for a stream Envoy reset), ``kvrouter_request_duration_seconds``,
``kvrouter_routing_decision_seconds``, ``kvrouter_prefix_overlap_ratio``,
``kvrouter_backend_requests`` and the engines' reported prompt and cached tokens.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

# From the last request body message to the pick's answer; the decision is most of it.
ANSWER_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1, 10)
MODES = ("buffered", "full_duplex_streamed", "headers_only")
SERVED = ("pick", "fallback", "unknown")
PHASES = ("request", "response")


class EppMetrics:
    """Decisions, picks, immediate responses and stream resets of the picker."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.decisions = Counter(
            "kvrouter_epp_decisions",
            "Picks answered to Envoy, by request body mode (headers_only: no body to route on).",
            ["mode"], registry=r,
        )  # fmt: skip
        self.picks = Counter(
            "kvrouter_epp_picks",
            "Responses by the endpoint that served them: the pick, a fallback of its list, or "
            "one Envoy did not name.",
            ["served"], registry=r,
        )  # fmt: skip
        self.immediate = Counter(
            "kvrouter_epp_immediate_responses",
            "Requests answered by Envoy on the picker's word, by HTTP status (429 shed, 503 "
            "nothing can serve, 4xx bad request).",
            ["code"], registry=r,
        )  # fmt: skip
        self.resets = Counter(
            "kvrouter_epp_stream_resets",
            "ext_proc streams that ended (Envoy reset or closed them) before the response's "
            "end, by the phase reached.",
            ["phase"], registry=r,
        )  # fmt: skip
        self.answer = Histogram(
            "kvrouter_epp_answer_seconds",
            "Time from the request's last body message to the picker's answer.",
            buckets=ANSWER_BUCKETS, registry=r,
        )  # fmt: skip
        # Children looked up once: a label lookup costs as much as a tenth of a decision.
        self.buffered, self.full_duplex, self.headers_only = map(self.decisions.labels, MODES)
        self.served_pick, self.served_fallback, self.served_unknown = map(self.picks.labels, SERVED)
        for phase in PHASES:
            self.resets.labels(phase)
