"""RabbitMQ adapters: the topology, the one place that publishes, and message codecs."""
