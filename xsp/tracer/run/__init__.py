"""The leveled runner: one process per level set (runner.py), the process itself (child.py) and the fork server that starts them (forkserver.py)."""
