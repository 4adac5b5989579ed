"""The bottom layer of the pipelines: the config schema and its checks, the errors a user makes, where paths
resolve, background repeats, and the names processes use to hand run ids to one another."""
