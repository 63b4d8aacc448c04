"""pwopsd: reproduction package for Position-Weighted On-Policy Self-Distillation (PW-OPSD).

The Snakemake workflow (``Snakefile``, ``workflow/``) calls into this package; every formula and
every file format lives here so that it can be imported and tested on its own.
"""

__version__ = "0.1.0"
