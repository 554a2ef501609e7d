"""Load generators, the stage recorder and benchmark scenarios for a live migsched stack."""
