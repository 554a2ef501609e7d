"""migsched's services: thin adapters (decode, call a policy, commit, publish, ack)."""
