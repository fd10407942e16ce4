"""The policy's command-line commands (sim, policy, bench, train)."""
