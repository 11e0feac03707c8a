"""streamsemi: streaming semi-supervised text classification on Kafka."""

__version__ = "0.1.0"
