"""Running one stage inside an MLflow run (``runner``) and the files the stages hand to each other (``bundle``)."""
