"""Tests of router.core.scorers."""
