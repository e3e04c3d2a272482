"""This node's name, as RabbitMQ's "rabbit@host": every face reports it (the
management API, Prometheus, trace messages)."""
import platform

NODE = "hutch@" + platform.node()
