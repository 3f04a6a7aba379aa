"""Precise mode: keying requests on the engines' own token ids and KV cache events.

- ``kv_events``: one ZMQ SUB per engine, feeding the engines' own word to the index.
- ``tokenize``: a request's token ids, from an engine's ``/tokenize`` or a local tokenizer
  (router.local_tokenizer).
- ``engines``: which engines are precise, whether one holds a prompt whole, and where the
  index's entries came from (for ``kvrouter_index_entries``).
"""
