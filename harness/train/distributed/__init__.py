"""The distributed runner: torchrun launch, one rank's sharded training, the job's result, the watchdog."""
