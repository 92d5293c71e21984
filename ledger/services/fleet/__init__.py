"""The fleet: worker identities and their lifecycle."""
