"""Tests of the kvrouter commands."""
