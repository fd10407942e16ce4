"""The operator's admission webhook: injects the tuner plugin, sidecar and NCCL env into pods."""
