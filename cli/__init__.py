"""The composition root: the `hutch-server` entry point and its settings loader.

Everything here wires the other packages together; nothing imports `cli`.
"""
