"""The event-log consumer: persists events from the bus into Postgres."""
