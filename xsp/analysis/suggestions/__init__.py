"""Suggestions: the rules that read a measurement and say what to change, with the replay's
estimate of what the change would save (``rules``)."""
