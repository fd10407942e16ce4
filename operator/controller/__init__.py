"""The operator process: kopf handlers that reconcile tuned jobs into ConfigMaps and TuningRuns."""
