"""Adapters that make an agent framework's tool calls fenced operations of a Fenceline run.

``fenceline_client.adapters.openai_agents`` (extra ``fenceline-client[openai-agents]``,
docs/openai-agents.md) and ``fenceline_client.adapters.langgraph`` (extra
``fenceline-client[langgraph]``, docs/langgraph.md) each import their framework;
``fenceline_client.adapters.fencing``, the part they share, imports none, and nothing here is
imported by ``fenceline_client`` itself: the core client installs and imports without them.
"""
