"""Figure builders: Plotly figure dicts from a run's data, one module per area (``runs``,
``phases``, ``compare``, ``probes``, ``interop``; shared parts in ``common``), and their JSON
for a page (``scriptjson``). Pure: no I/O, no web framework; the pages (``app.web``) and the
stored run summaries (``app.services.run_summaries``) both use them."""
