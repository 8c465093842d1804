"""Tools for guirl's developers: `python -m guirl.devtools.layers` checks the package graph."""
