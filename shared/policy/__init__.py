"""Pure scheduling policies over immutable snapshots: no I/O, clock or randomness unless handed in."""
