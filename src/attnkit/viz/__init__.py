"""Visualisations of attention (rich terminal output)."""
