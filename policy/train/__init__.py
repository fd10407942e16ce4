"""Training the policy (torch): datasets, imitation, PPO, ensembles, offline rows from the store."""
