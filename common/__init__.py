"""What lessons use: bootstrap, report, buffers, p2p, shards, bandwidth, timing, counting, devices,
watchdog. The runner's own modules live in common/runner/ (imported by bin/tutor and the tests only)."""
