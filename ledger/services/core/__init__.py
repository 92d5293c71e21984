"""The steps every domain takes: the fence, an operation's phase change, a person's decision, the hand-over to a person."""
