"""Dead-letter analysis with Apache Spark (PySpark), run as separate processes.

The broker never imports this package (tests/test_layers.py holds it to that);
it reads the broker's dead-letter log over the network.
"""
