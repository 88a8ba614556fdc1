"""Model implementations written for the paged KV cache."""
