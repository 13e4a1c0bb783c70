"""HTTP routes: chat, models, admin, health and metrics."""
