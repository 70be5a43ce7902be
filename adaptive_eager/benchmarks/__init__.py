"""adaptive-eager benchmark suite. Run ``python -m benchmarks`` (see README.md)."""
