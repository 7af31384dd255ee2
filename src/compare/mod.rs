//! Baselines and verdicts: compare results against a committed baseline per metric.
