"""Example model factories for the collectors: each returns ``(model, example_inputs)``."""
