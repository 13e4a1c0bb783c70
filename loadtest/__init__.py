"""semgate's load generator: drives OpenAI-compatible endpoints over HTTP and reports on them."""
