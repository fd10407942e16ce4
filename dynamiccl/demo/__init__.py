"""`dynamiccl demo` and `make demo-cluster`: the whole loop told end to end."""
