"""The Kafka layer on top of the engine: settings, clients, output ledger, checkpoints, worker."""
