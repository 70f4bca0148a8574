"""Replica serving: the Serve deployment around the engine, its wire format and load board."""
