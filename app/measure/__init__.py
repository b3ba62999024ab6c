"""Measuring above the engine: the bench and its report, tune, the replays, doctor's decode check and report, the
drafter ranking, and prompts files. Each drives the engine worker through ``app.engine.client`` as any front
end does."""
