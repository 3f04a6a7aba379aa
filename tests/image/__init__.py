"""Tests of the container image: the Dockerfile and .dockerignore, read as text."""
