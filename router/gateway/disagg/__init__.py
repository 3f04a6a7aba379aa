"""Prefill/decode disaggregation in the gateway: a request split across two engines.

The core decides (router.core.disaggregation): whole on one engine, or split, prefilled on a
prefill engine and decoded on a decode engine. Here the split is carried out:

- ``paths``: when disaggregation applies, the core's decision instead of the aggregated one,
  the whole path's plan, /debug/route's account, and the split's start by protocol.
- ``wire``: the two protocols' bodies as pure functions (vLLM's ``kv_transfer_params``,
  SGLang's bootstrap fields), and the answer without them.
- ``answers``: the decode engine's answer relayed without the protocols' fields.
- ``prefill``: the prefill request, read whole; the exchange as a split drives it.
- ``vllm``: prefill, then decode with what the prefill engine answered.
- ``sglang``: prefill and decode at once, paired by a bootstrap room.
- ``metrics``: decisions by path and why, estimated transfers, in-flight load per role.

A split is one request of the exchange (router.gateway.exchange): its attempts, retry budget,
failure counting and cancellation are the exchange's, used as they are.
"""
