"""ddlkit's Weights & Biases logger (``logger=wandb``)."""

__version__ = "0.1.0"
