"""Conversion: raw records (records.py) to span tables (spans.py: model and framework; cuda.py: library and GPU), nested by recorded ranges and ids (intervals.py). Pure functions, no torch."""
