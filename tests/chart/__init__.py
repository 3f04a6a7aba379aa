"""Tests of the Helm chart: rendered, linted, validated, and checked against a live router."""
