"""The data-plane router: per-request remote/local prefill with fallbacks (aiohttp)."""
