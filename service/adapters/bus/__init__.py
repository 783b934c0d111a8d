"""RabbitMQ adapters: the topology, the one place that publishes, the one way to
consume, and message codecs. Nothing outside this package imports aiormq or
aio-pika's channel internals; ``fastpath`` is the only module below aiormq's
public API, and it is off until a component switches it on."""
