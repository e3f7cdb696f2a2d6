"""The only package that speaks CQL. Each module is one table family's access and guarantees."""
