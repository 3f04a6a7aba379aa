"""Tests of router.gateway."""
