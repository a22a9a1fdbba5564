"""``blockspace soak``: long runs that look for leaks, drift and disagreement
(cli.py). A tool: it drives managers through the conformance kit's random
walk and through the simulator; neither the managers nor the kit import it.
"""
