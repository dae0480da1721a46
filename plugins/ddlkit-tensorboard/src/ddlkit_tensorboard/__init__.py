"""ddlkit's TensorBoard logger (``logger=tensorboard``)."""

__version__ = "0.1.0"
