"""The stages, one module each; the stage table that declares them is `pipelines.base.stages`."""
