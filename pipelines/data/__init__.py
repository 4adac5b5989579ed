"""The data: loaders and the train/validation/test split (``datasets``), your own tables (``tables``), Parquet
streamed without being read whole (``streams``) and the class labels of a classification target (``labels``)."""
