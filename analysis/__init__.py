"""Analyses of the model at initialisation: Lanczos spectra and what the analysis scripts share."""
