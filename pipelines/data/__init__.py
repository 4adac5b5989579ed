"""The data: loaders and the train/validation/test split (``datasets``), your own tables (``tables``) and the
class labels of a classification target (``labels``)."""
