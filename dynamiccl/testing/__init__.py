"""Test and tool support: not shipped in the runtime image."""
