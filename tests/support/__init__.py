"""Helpers shared by the test files: memory layouts, the mask catalogue, reference helpers."""
