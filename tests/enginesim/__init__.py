"""Tests of router.enginesim."""
