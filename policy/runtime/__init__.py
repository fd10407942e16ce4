"""Torch-free policy runtime: decisions, compile-to-table and numpy inference."""
