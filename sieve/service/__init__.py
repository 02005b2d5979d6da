"""HTTP service: settings, schemas, app factory, thin handlers, metrics, CLI."""
