"""Durable state of the ingest process: experience store, backends, migrations, model registry."""
