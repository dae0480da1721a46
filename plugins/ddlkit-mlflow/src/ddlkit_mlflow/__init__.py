"""ddlkit's MLflow logger (``logger=mlflow``)."""

__version__ = "0.1.0"
