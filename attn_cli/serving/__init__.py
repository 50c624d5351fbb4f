"""attn serve: the HTTP server, its APIs and its page."""
