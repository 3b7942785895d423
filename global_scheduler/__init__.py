"""global_scheduler package (see ARCHITECTURE.md)."""
