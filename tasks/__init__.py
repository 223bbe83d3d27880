"""The Prefect tasks the flows compose, each a thin unit over the engine."""
