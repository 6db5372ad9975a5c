"""Batch characterization campaigns: a models x batch sizes x modes matrix of leveled runs,
resumable, spread over every local GPU (or a Ray cluster), with one store and one report."""
