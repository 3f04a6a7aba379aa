"""The client's side of the gateway: who may connect, who may call, who must wait.

- ``connections``: client connections: the cap, the header deadline, malformed HTTP.
- ``auth``: client API keys: who may use the OpenAI routes, and under which name.
- ``body``: the request body, read bounded in size and in time.
- ``request_id``: the id that names a request in errors, logs and engine calls.
- ``admission``: flow control: the bounded, fair queue in front of a full fleet
  (over router.core.admission's pure queue).
"""
