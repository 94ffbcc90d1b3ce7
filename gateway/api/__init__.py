"""The HTTP request API: reading bodies, decoding and checking them, the typed requests and answers of
every route, and the OpenAPI document generated from those types."""
