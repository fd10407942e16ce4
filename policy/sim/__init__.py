"""The NCCL simulator: topology, NCCL's cost model, calibration against published measurements."""
