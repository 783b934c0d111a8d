"""The integration tier: against the real RabbitMQ and the real Postgres, each session in
a namespace of its own."""
