"""Online tuning primitives: bandit, CUSUM, guardrail, sequential tests, env-knob experiment."""
