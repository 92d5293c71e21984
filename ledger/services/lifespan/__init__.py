"""What a run holds and how long it lives: progress checkpoints (the first part of the
lifespan article; instances, limits, cancellation and resources are to come here too)."""
