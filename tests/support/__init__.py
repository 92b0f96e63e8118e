"""Helpers shared by the tests (builders, oracles, toy backends); no tests here."""
