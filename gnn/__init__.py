"""gnn package (see ARCHITECTURE.md)."""
