"""What runs under every rank and no lesson calls: the world's proof, the watchdog, teardown, device
probing, the flight recorder's wrappers and checks, the file guard, and the run folder's names that the
ranks and the runner (common/runner/) share. A lesson calls common/; this is what holds it up."""
