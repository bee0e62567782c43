"""Helpers the test directories share: a kernel backend without Docker, HTTP clients, route tables."""
