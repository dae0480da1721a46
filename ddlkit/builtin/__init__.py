"""In-core plugins. They register through the same hooks as third-party plugins."""
