"""HTTP layer: thin flask-smorest views over the use cases in app/. Only this package knows HTTP."""
