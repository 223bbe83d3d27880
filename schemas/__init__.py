"""Pydantic models of the API contract and the engine's result records (imports nothing of ours)."""
