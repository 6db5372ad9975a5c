"""Readers and analyses over xsp run stores. Analyses are pure functions from a store to a table;
plots and reports call them. This package never imports the tracer's capture code."""
