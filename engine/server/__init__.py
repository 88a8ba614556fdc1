"""The OpenAI-compatible HTTP server of one engine replica (`folio serve`).

`app.build_app(engine, ServingConfig(...))` makes the FastAPI app; `lifecycle.DrainingServer` runs it
with a graceful drain on SIGTERM. Nothing here imports torch: the engine is handed in.
"""
