"""What every scheduling service shares: runner (start, signals, graceful stop), metrics, base class."""
