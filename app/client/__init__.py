"""The load generator a worker runs: datasets, load shapes, the streaming HTTP client, the
runner, the target's /metrics scraper, and ``execute`` (a load with its observers, and the
run's metadata). Imports nothing of the server (services, storage, api, web)."""
