"""Evaluation: metrics, paper protocols, baselines, stream replay and the results page."""
