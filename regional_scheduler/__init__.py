"""regional_scheduler package (see ARCHITECTURE.md)."""
