"""Transport only: the HTTP listener on the Unix socket and its routes.

Bodies are decoded into the model here, and nothing is decided.
"""
