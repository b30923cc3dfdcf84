"""dpsad: differentially private synthetic image data by stochastic adversarial distillation."""

__version__ = "0.3.10"
