"""cgd: the daemon, its layers from the HTTP API down to the typed model, and its Python client."""
