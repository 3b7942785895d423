"""node_agent package (see ARCHITECTURE.md)."""
