"""Benchmarks: everything on this machine, real RabbitMQ and Postgres."""
