"""Property-based (hypothesis) tests: valid calls against the float64 reference, invalid calls
against the error contract. ``profiles.py`` says how many examples each test runs."""
