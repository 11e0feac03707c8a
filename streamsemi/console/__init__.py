"""``streamsemi console``: a web application for the people who steer streamsemi.

It reads the assignments, labels, control, documents, clusters and suggestions topics
into bounded in-memory tables (:mod:`streamsemi.console.state`, filled by the reader
thread of :mod:`streamsemi.console.reader`) and writes control messages (seed labels,
unlabels, refits, cluster names) after the same validation as ``streamsemi label``
(:mod:`streamsemi.console.writer`). The web layer (:mod:`streamsemi.console.app`) is
Starlette with server-rendered Jinja2 pages and one small script, every asset served
from this package. Only :mod:`~streamsemi.console.app` and
:mod:`~streamsemi.console.server` need the ``console`` extra.
"""
