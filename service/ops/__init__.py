"""An operator's tools: ``setup`` (every component's identity, the broker's topology,
the database), ``migrate``, the dead letters, the subscribers and the bus's AsyncAPI
document."""
