"""The policy side: the typed action space (here), prompt building and response parsing (a later part)."""
