"""Test support that ships with guirl: the one module of protocol fakes (`guirl.testing.fakes`)."""
