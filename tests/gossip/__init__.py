"""Tests of router.gossip."""
