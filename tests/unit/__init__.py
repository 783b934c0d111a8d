"""The unit tier: no broker, no database, no browser (`make test-unit`, under a minute)."""
