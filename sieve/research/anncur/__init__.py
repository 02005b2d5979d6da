"""annCUR (Yadav et al. 2022): the index of CUR item embeddings, its stages (registered by sieve.research), `sieve index anncur`."""
