"""Providers."""
