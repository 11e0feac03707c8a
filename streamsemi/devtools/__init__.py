"""Tools for trying streamsemi out: the embedded broker, corpus replay and the demo."""
