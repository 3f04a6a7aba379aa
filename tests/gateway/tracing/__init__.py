"""Tests of router.gateway.tracing."""
