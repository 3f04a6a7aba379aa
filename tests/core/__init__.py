"""Tests of router.core."""
