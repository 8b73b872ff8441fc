"""The result store: result files (written atomically, never overwritten), their JSON Schemas,
and the reservation that holds an output path from before a run's first step to its write."""
