"""The ``disaggregation`` section: how a fleet with prefill and decode engines is driven.

    disaggregation:
      protocol: vllm            # vllm (kv_transfer_params) or sglang (bootstrap fields)
      link_gbps: 100            # the prefill-to-decode link
      kv_bytes_per_token: 131072
      # or the model's shape, from which the bytes per token follow:
      # model: {layers: 32, kv_heads: 8, head_dim: 128, bytes_per_value: 2}
      prefill_tokens_per_s: 10000
      stay_below_tokens: 256
      decode_stall_weight: 1.0
      decider: cost             # or always (every request split), threshold (split when
      threshold_tokens: 100     #   the decode engine lacks more than threshold_tokens)

The settings are the core's (router.core.disaggregation.DisaggSettings, where each is
explained). They apply once some engine's role is prefill or decode (``engines.static[].role``,
``engines.dns[].role``); a fleet whose engines all do both is served as before.
"""

from __future__ import annotations

from router.core.disaggregation import DECIDERS, PROTOCOLS, DisaggSettings, ModelShape
from router.core.fields import ConfigFields


def _shape(f: ConfigFields) -> ModelShape:
    out = ModelShape(
        layers=f.integer("layers", 0, 1, 1024),
        kv_heads=f.integer("kv_heads", 0, 1, 1024),
        head_dim=f.integer("head_dim", 0, 1, 16384),
        bytes_per_value=f.integer("bytes_per_value", 2, 1, 8),
    )
    for key in ("layers", "kv_heads", "head_dim"):
        if not f.has(key):
            f.fail(f.at(key), "is required")
    f.done()
    return out


def disaggregation(f: ConfigFields | None) -> DisaggSettings:
    """The section's settings (the defaults without one)."""
    d = DisaggSettings()
    if f is None:
        return d
    shape = f.sub("model")
    if shape is not None and f.has("kv_bytes_per_token"):
        f.fail(f.at("model"), "give kv_bytes_per_token or the model's shape, not both")
    per_token = f.integer("kv_bytes_per_token", d.kv_bytes_per_token, 1, 1 << 30)
    if shape is not None:
        per_token = _shape(shape).kv_bytes_per_token
    out = DisaggSettings(
        protocol=f.choice("protocol", d.protocol, PROTOCOLS),  # type: ignore[arg-type]
        link_gbps=f.number("link_gbps", d.link_gbps, 0.001, 1e6),
        kv_bytes_per_token=per_token,
        prefill_tokens_per_s=f.number("prefill_tokens_per_s", d.prefill_tokens_per_s, 1.0, 1e9),
        stay_below_tokens=f.integer("stay_below_tokens", d.stay_below_tokens, 0, 10_000_000),
        decode_stall_weight=f.number("decode_stall_weight", d.decode_stall_weight, 0.0, 1000.0),
        decider=f.choice("decider", d.decider, DECIDERS),  # type: ignore[arg-type]
        threshold_tokens=f.integer("threshold_tokens", d.threshold_tokens, 0, 10_000_000),
    )
    f.done()
    return out
