"""Side-by-side benchmarks of dedup_jobs and its peers (run ``python -m benchmarks.peers``)."""
