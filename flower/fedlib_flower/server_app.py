"""The coordinator's ServerApp: ``main(grid, context)`` runs one federation
(:class:`fedlib_flower.coordinator.Coordinator`) as the run config says."""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedlib_flower.coordinator import Coordinator, return_large_buffers
from fedlib_flower.settings import Settings

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    settings = Settings.from_run_config(context.run_config)
    return_large_buffers()
    Coordinator(grid, settings, log=lambda line: print(f"fedlib: {line}", flush=True)).run()
