"""The ingest process: authenticated reward ingest and model serving over HTTPS."""
