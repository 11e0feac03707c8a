"""The ground every layer stands on: messages, features, stores, telemetry, logs, corpora.

Nothing here imports another streamsemi layer or Kafka.
"""
