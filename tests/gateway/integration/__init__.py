"""Tests that start real processes on loopback: engine-sims and ``kvrouter serve``.

What they share: the model engine-sim serves, and the admin token their routers are started
with (``ADMIN_ENV``) so that ``/debug/route`` answers requests carrying ``ADMIN``.
"""

MODEL = "sim-model"
ADMIN_TOKEN = "integration-admin-token"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
ADMIN_ENV = {"KVROUTER_ADMIN_TOKEN": ADMIN_TOKEN}
