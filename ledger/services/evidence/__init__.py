"""The evidence chain: appending events in the transition's transaction, and the verifier that seals checkpoints."""
