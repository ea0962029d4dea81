"""The wire between the dashboard and its workers: job and result models, event packing,
probe results and Prometheus series. Pure: no ORM, no web framework, no I/O."""
