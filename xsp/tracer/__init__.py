"""In-process capture for xsp: levels, sessions, the leveled runner, the zoo and the exporters.

Importing this package is cheap; torch is imported by the modules that need it.
"""
