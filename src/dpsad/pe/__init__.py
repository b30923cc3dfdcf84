"""Private Evolution (Lin et al., ICLR 2024): a synthetic set evolved from a public generator by noisy votes."""

from .evolution import PE_KIND, private_evolution
from .simulator_evolution import simulator_evolution

__all__ = ["PE_KIND", "private_evolution", "simulator_evolution"]
