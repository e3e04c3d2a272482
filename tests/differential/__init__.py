"""Differential tests: hutch and a real RabbitMQ, observed side by side."""
