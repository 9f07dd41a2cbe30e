"""Verification and sampling: the acceptance rules, their dispatch to the kernels, the noise."""
