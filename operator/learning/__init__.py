"""The learning loop (runs in the ingest process): canary, promotion, retraining, env-knob loop."""
